"""``pytest-gpucolloc`` console command."""
from __future__ import annotations

import argparse
import json
import sys

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pytest-gpucolloc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="GPUs, driver and sharing modes as this machine reports them").set_defaults(run=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
