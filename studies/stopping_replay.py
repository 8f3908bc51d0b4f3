"""Replays the rule that decides when a scenario's measurement has enough rounds (``measure.enough_rounds``) on
the rounds saved in pytest-benchmark JSON files: for each scenario, after how many rounds the rule would have
stopped, why, and how far that shorter mean lies from the mean of every saved round.

    python studies/stopping_replay.py RUN.json [RUN.json ...] [--rounds 5] [--most 10] [--precision 0.5]
                                      [--markdown OUT.md]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tabulate import tabulate

from pytest_gpucolloc import measure


def replay(rounds: list[float], fewest: int, most: int, precision: float) -> tuple[int, str]:
    """The rounds the rule would have taken of ``rounds`` (fewest first, then as many as it asks for), and why
    it stopped; ``"saved rounds ran out"`` when it would have asked for more than were saved."""
    taken = min(fewest, len(rounds))
    while True:
        stopped, needed = measure.enough_rounds(rounds[:taken], precision, most)
        if stopped:
            return taken, stopped
        if taken >= len(rounds):
            return taken, "saved rounds ran out"
        taken = min(needed, most, len(rounds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5, help="the fewest rounds (--colloc-rounds)")
    parser.add_argument("--most", type=int, default=10, help="the most rounds (--colloc-max-rounds)")
    parser.add_argument("--precision", type=float, default=0.5, help="percent (--colloc-precision)")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    rows, fewer = [], 0
    for path in args.runs:
        for bench in json.loads(path.read_text())["benchmarks"]:
            info = bench["extra_info"]
            if "same_as" in info.get("measurement", {}):
                continue  # a measurement recorded again under another scenario: replayed where it was taken
            rounds = info["aggregate_round_throughputs"]
            taken, why = replay(rounds, args.rounds, args.most, args.precision / 100)
            fewer += len(rounds) - taken
            stopped_then = info.get("measurement", {}).get("stopped", "-")
            rows.append([path.name, bench["name"], len(rounds), stopped_then, taken, why,
                         f"{measure.coefficient_of_variation(rounds):.1%}",
                         f"{statistics.geometric_mean(rounds[:taken]) / statistics.geometric_mean(rounds) - 1:+.2%}"])
    headers = ["run", "scenario", "rounds saved", "stopped then", "rounds now", "stopped now", "round CV",
               "mean now vs saved"]
    table = tabulate(rows, headers, tablefmt="github")
    shorter = [r for r in rows if r[4] < r[2]]
    summary = f"{len(rows)} scenarios; {len(shorter)} would take fewer rounds, {fewer} rounds fewer in all"
    print(table + "\n\n" + summary)
    if args.markdown:
        args.markdown.write_text(table + "\n\n" + summary + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
