"""``pytest-gpucolloc`` console command."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import nvml
from .modes import MODES


def cmd_info(args) -> int:
    reason = nvml.init()
    info: dict = {"modes": {name: mode.summary for name, mode in MODES.items()}}
    if reason:
        info["gpus"] = []
        info["note"] = reason
    else:
        info["driver"] = nvml.driver()
        info["gpus"] = [{"index": g.index, "uuid": g.uuid, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
                         "mig_mode": g.mig_mode, **g.extra} for g in nvml.gpus()]
    print(json.dumps(info, indent=2))
    return 0


def cmd_table(args) -> int:
    from . import report

    entries = []
    for path in args.files:
        entries += report.entries_from_json(path)
    print(report.table(entries, fmt="github" if args.format == "markdown" else "simple"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pytest-gpucolloc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="GPUs, driver and sharing modes as this machine reports them").set_defaults(run=cmd_info)
    table = commands.add_parser("table", help="table of the scenarios in pytest-benchmark JSON files")
    table.add_argument("files", nargs="+", type=Path)
    table.add_argument("--format", choices=["markdown", "text"], default="markdown")
    table.set_defaults(run=cmd_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
