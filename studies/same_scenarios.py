"""The same scenarios (sharing mode and jobs) measured by earlier runs and by later ones, e.g. before and after a
change to how measurements are taken: each later aggregate throughput against the earlier ones, and whether the
later runs are higher or lower overall (a Wilcoxon signed-rank test on the log-ratios: a change that biased the
measurements would shift them all one way; the noise between single runs moves them both ways).

    python studies/same_scenarios.py --earlier RUN.json [RUN.json ...] --later RUN.json [RUN.json ...]
                                     [--markdown OUT.md]

A scenario is matched by its mode and its jobs' labels, not by test name (test ids have changed over time). A
later record that repeats a measurement taken once (``same_as``) is left out, as are CPU smoke runs.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats
from tabulate import tabulate

from pytest_gpucolloc.report import describe_workers


def scenarios(paths: list[Path]) -> dict[tuple, list[tuple[str, float, float]]]:
    """(mode, jobs) -> [(run file, aggregate samples/s, round CV)] of the GPU records in ``paths``."""
    found: dict[tuple, list] = defaultdict(list)
    for path in paths:
        for bench in json.loads(path.read_text())["benchmarks"]:
            info = bench.get("extra_info", {})
            if info.get("device") != "cuda" or "same_as" in info.get("measurement", {}):
                continue
            key = (info["mode"], describe_workers(info["workloads"]))
            found[key].append((f"{path.parent.name}/{path.name}", info["aggregate_throughput"],
                               info.get("aggregate_cv") or 0.0))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--earlier", nargs="+", type=Path, required=True)
    parser.add_argument("--later", nargs="+", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    earlier, later = scenarios(args.earlier), scenarios(args.later)
    rows, ratios = [], []
    for key in sorted(set(earlier) & set(later)):
        before = [value for _, value, _ in earlier[key]]
        for run, value, cv in later[key]:
            ratio = value / statistics.geometric_mean(before)
            ratios.append(math.log(ratio))
            rows.append([key[0], key[1], len(before), f"{min(before):,.0f}-{max(before):,.0f}"
                         if len(before) > 1 else f"{before[0]:,.0f}", f"{value:,.0f}", f"{ratio - 1:+.1%}",
                         f"{cv:.1%}", run])
    if not rows:
        print("no scenario was measured by both the earlier and the later runs")
        return 3
    table = tabulate(rows, ["mode", "jobs", "earlier runs", "earlier samples/s", "later samples/s",
                            "later vs earlier", "later round CV", "later run"], tablefmt="github")
    spread = sorted(abs(math.expm1(r)) for r in ratios)
    summary = (f"{len(rows)} later measurements of {len({(r[0], r[1]) for r in rows})} scenarios; "
               f"median |difference| {statistics.median(spread):.1%}, the largest {spread[-1]:.1%}; "
               f"{sum(r > 0 for r in ratios)} higher, {sum(r < 0 for r in ratios)} lower; "
               f"geometric mean of later/earlier {math.exp(statistics.fmean(ratios)) - 1:+.1%}")
    if len(ratios) >= 6:
        summary += f" (Wilcoxon signed-rank p = {stats.wilcoxon(ratios).pvalue:.2f})"
    print(table + "\n\n" + summary)
    if args.markdown:
        args.markdown.write_text(table + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
