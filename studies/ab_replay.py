"""Every `ab` of a service whose blocks are kept under docs/results (each output folder's latency-windows.json),
judged again by today's latency rule as `ab` applies it: a look after each block (the per-look alpha over
--ab-max-blocks looks), stopping at the first look where no latency row is left inconclusive, else at the last
block kept. Beside it, what that ab printed then. The blocks are real GPU measurements; the design they were
measured under (a fork server per arm or per block, clients connecting at once or in order) is the folder's.
    python studies/ab_replay.py [--markdown FILE]
"""
from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

from pytest_gpucolloc import ab_judge

ROOT = Path(__file__).resolve().parent.parent
ALPHA, THRESHOLD, MAX_BLOCKS, MIN_BLOCKS = 0.005, 0.02, 12, 3  # ab's defaults
LABELS = ("baseline", "candidate")


def kept_abs() -> list[tuple[str, str, dict, dict]]:
    """(folder, part, latency windows by scenario, the verdicts printed then) of every kept ab output folder."""
    found = []
    for archive in sorted((ROOT / "docs" / "results").rglob("ab-*-out.tar.gz")):
        with tempfile.TemporaryDirectory() as folder, tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
            windows = next(Path(folder).rglob("latency-windows.json"), None)
            verdicts = next(Path(folder).rglob("verdicts.json"), None)
            if windows is not None:
                then = json.loads(verdicts.read_text()) if verdicts is not None else {}
                found.append((str(archive.parent.relative_to(ROOT / "docs" / "results")),
                              archive.name.removesuffix("-out.tar.gz"), json.loads(windows.read_text()), then))
    return found


def replay(blocks: list[dict]) -> list[ab_judge.Judgement]:
    """The latency judgements ab would print over these blocks, looking after each."""
    judged: list[ab_judge.Judgement] = []
    for n in range(1, len(blocks) + 1):
        judged = ab_judge.judge_latency("s", blocks[:n], LABELS, THRESHOLD, ALPHA, looks=MAX_BLOCKS)
        if n >= MIN_BLOCKS and not any(j.verdict == "inconclusive" and not (j.final or j.saturated) for j in judged):
            break
    return judged


def said(j: ab_judge.Judgement | None) -> str:
    if j is None:
        return "-"
    return j.verdict if j.change is None else f"{j.verdict} {j.change:+.1%} ({j.blocks})"


def then_said(then: dict, scenario: str, metric: str) -> str:
    rows = then.get("judgements", then) if isinstance(then, dict) else then
    for row in rows if isinstance(rows, list) else []:
        if row.get("scenario", "").endswith(scenario.split("::")[-1]) and row.get("metric") == metric:
            return row.get("verdict", "-")
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markdown")
    args = parser.parse_args()
    lines = ["| results folder | ab | scenario | blocks kept | p50 now (blocks) | p99 now (blocks) | p50 then "
             "| p99 then |", "|---|---|---|---|---|---|---|---|"]
    counts: dict[str, dict[str, int]] = {}
    for folder, part, scenarios, then in kept_abs():
        for scenario, blocks in scenarios.items():
            rows = {j.metric: j for j in replay(blocks)}
            lines.append(f"| {folder} | {part} | {scenario.split('::')[-1]} | {len(blocks)} | "
                         f"{said(rows.get('p50'))} | {said(rows.get('p99'))} | {then_said(then, scenario, 'p50')} | "
                         f"{then_said(then, scenario, 'p99')} |")
            kind = "A/A" if part.startswith("ab-aa") else part
            for j in rows.values():
                counts.setdefault(kind, {}).setdefault(j.verdict, 0)
                counts[kind][j.verdict] += 1
    lines += ["", "Latency judgements now, by kind of ab (every percentile judged):", ""]
    lines += [f"- {kind}: " + ", ".join(f"{verdict} {n}" for verdict, n in sorted(found.items()))
              for kind, found in counts.items()]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")


if __name__ == "__main__":
    main()
