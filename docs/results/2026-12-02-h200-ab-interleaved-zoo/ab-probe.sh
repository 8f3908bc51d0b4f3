#!/usr/bin/env bash
# Probe: interleaved ab on zoo jobs (A/A and -2% in one job), one H200.
set -u
out=${1:-$OUT}; mkdir -p "$out"
exec > >(tee "$out/probe.log") 2>&1
nvidia-smi --query-gpu=name,uuid,driver_version,power.limit --format=csv
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "install failed"
project=$(mktemp -d)/p; mkdir -p "$project"; cp -r zoo "$project/"
cat > "$project/test_pair.py" <<'PY'
import pytest
from pytest_gpucolloc import Workload

@pytest.mark.parametrize("job, batch, precision", [("transformer_encoder", 32, "bf16"), ("unet", 32, "fp32")])
def test_same(collocate, job, batch, precision):
    collocate([Workload(f"zoo.models:{job}", batch_size=batch, precision=precision)] * 2)

@pytest.mark.parametrize("job, batch, precision", [("transformer_encoder", 32, "bf16"), ("unet", 32, "fp32")])
def test_slowed(collocate, job, batch, precision):
    collocate([Workload(f"zoo.slowed:{job}", batch_size=batch, precision=precision)] * 2)
PY
echo "from .models import *  # noqa" > "$project/zoo/slowed.py"
cd "$project"; git init -q; git add .; git -c user.email=p@invalid -c user.name=p commit -qm parent
printf 'import os\nos.environ["ZOO_EXTRA_WORK"] = "0.02"\nfrom .models import *  # noqa\n' > zoo/slowed.py
git -c user.email=p@invalid -c user.name=p commit -qam child
start=$(date +%s)
timeout -s INT ${PROBE_SECONDS:-480} pytest-gpucolloc ab --baseline HEAD~1 --candidate HEAD --ab-budget-minutes ${PROBE_MINUTES:-7.5} \
  --ab-scenario-minutes 2 --out "$out/arms" --storage "$out/storage" --json "$out/ab.json" --markdown "$out/ab.md" \
  -- test_pair.py --gpu-mode=mps
echo "ab exit $? after $(( $(date +%s) - start )) s"
grep -h "scenario\|passed\|failed\|error" "$out"/arms/*.log | tail -20
pgrep -af "nvidia-cuda-mps|pytest_gpucolloc" || echo "no MPS daemon or worker left"
