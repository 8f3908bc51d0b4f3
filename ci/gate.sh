#!/usr/bin/env bash
# Run the benchmark tier on a GPU runner and gate it against the saved history. Any CI can call it.
#   ci/gate.sh HISTORY_DIR OUT_DIR [extra pytest arguments...]
# HISTORY_DIR: pytest-benchmark storage holding earlier runs (fetched by the CI job; see ci/README.md).
# OUT_DIR:     receives run.json, gate.md (Markdown verdicts), plots/ and pytest.log.
# It demands the GPU (--colloc-device=cuda): a runner whose GPU or driver is missing fails (exit 2) instead of
# skipping every scenario and passing.
# Exit codes: 0 no regression; 1 a scenario regressed (or a test failed); 2 usage or setup error (no GPU);
#             5 the run recorded no scenario or the gate judged none (nothing gated: not a pass), pytest's own
#             code for it (docs/gate.md, "Exit codes").
set -u -o pipefail
history=${1:?usage: ci/gate.sh HISTORY_DIR OUT_DIR [pytest args...]}
out=${2:?usage: ci/gate.sh HISTORY_DIR OUT_DIR [pytest args...]}
shift 2
mkdir -p "$history" "$out" || exit 2
"${PYTHON:-python3}" -m pytest benchmarks/ -p no:cacheprovider --colloc-device=cuda \
  --gpu-mode="${GPU_MODES:-sequential,naive,mps}" \
  --benchmark-storage="file://$history" --benchmark-json="$out/run.json" \
  --colloc-gate --colloc-gate-report="$out/gate.md" "$@" 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
case $status in
  0|1) ;;
  5) echo "nothing gated: no benchmark collected, or the gate judged no scenario (see $out/pytest.log)" >&2; exit 5 ;;
  *) exit 2 ;;
esac
[[ -s $out/run.json ]] || exit 5
"${PYTHON:-python3}" -m pytest_gpucolloc.cli plot --storage "$history" --out "$out/plots" >/dev/null || true
exit $status
