"""The gate across a fleet, replayed on real runs of two H200s: each run of one GPU judged as if that GPU were a
fresh CI runner with no history of its own, against the other GPU's saved runs, its level placed by the scenarios
judged before it in the same run (``gate.decide``'s ``references``, as the pytest gate does in a session).

    python studies/fleet_replay.py

The runs: the zoo's gate runs (docs/zoo.md) on GPU-961cbc92 (2026-12-02) and GPU-1dabc450 (2026-12-03), every
scenario in the order a session runs them. The U-Net is left out: its code differed between the two days (cuDNN
autotuning, then PyTorch's heuristics), so its runs are not the same job. A/A: each run but the slowed one; truth
-3.8%: the slowed run (one extra step every 25). Also shown: the same judgements with no placement (``references``
empty), which the gate answers with `no baseline` rather than call two machines' difference a change.
"""
import collections
import tarfile
import tempfile
from pathlib import Path

from tabulate import tabulate

from pytest_gpucolloc import gate
from pytest_gpucolloc.history import load

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
GPUS = {"GPU-961cbc92": RESULTS / "2026-12-02-h200-zoo-gate-and-ab" / "gate-history.tar.gz",
        "GPU-1dabc450": RESULTS / "2026-12-03-h200-zoo-gate-second-gpu" / "gate-history.tar.gz"}
ORDER = [f"zoo/test_zoo.py::test_{job}[mps]" for job in ("transformer_encoder", "char_lstm", "mlp")]  # no U-Net


def history_of(archive: Path, into: Path):
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return load(into)


def replay(current_runs, other, placed: bool) -> list[dict]:
    """Every scenario of every current run judged against ``other``'s runs only."""
    rows = []
    for run in current_runs:
        slowed = run.run_id.endswith("slowed")
        references = []
        for name in ORDER:
            current = run.sample(name)
            if current is None:
                continue
            saved = other.samples(name, exclude={r.run_id for r in other.runs if r.run_id.endswith("slowed")})
            verdict = gate.decide(current, saved, gate.Policy(), references if placed else ())
            rows.append({"run": run.run_id, "scenario": name, "truth": "-3.8%" if slowed else "none",
                         "verdict": verdict.verdict, "change": verdict.change, "detectable": verdict.mde,
                         "how": verdict.fleet or "-"})
            references.append((current, saved))
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        histories = {gpu: history_of(archive, Path(scratch) / gpu) for gpu, archive in GPUS.items()}
        for placed in (True, False):
            print(f"\n## {'placed by the scenarios judged before it' if placed else 'not placed (no references)'}\n")
            rows = []
            for here, there in (list(GPUS), list(GPUS)[::-1]):
                for row in replay(histories[here].runs, histories[there], placed):
                    rows.append({"GPU judged": here, "history of": there, **row})
            print(tabulate([{k: (f"{v:+.1%}" if k == "change" and v is not None else
                                 f"{v:.1%}" if k == "detectable" and v is not None else v)
                             for k, v in row.items()} for row in rows], headers="keys", tablefmt="github"))
            counts = collections.Counter((row["truth"], row["verdict"]) for row in rows)
            print("\n| truth | " + " | ".join(gate_verdicts := sorted({v for _, v in counts})) + " |")
            print("|---" * (len(gate_verdicts) + 1) + "|")
            for truth in ("none", "-3.8%"):
                print(f"| {truth} | " + " | ".join(str(counts[(truth, v)]) for v in gate_verdicts) + " |")


if __name__ == "__main__":
    main()
