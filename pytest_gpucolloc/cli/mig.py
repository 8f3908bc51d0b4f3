"""The MIG commands: profiles of a GPU, a layout planned for a set of jobs, a checkpoint restored."""
from __future__ import annotations

import json
from pathlib import Path

from .. import nvml
from ..mig import planner
from ..mig.nvml_backend import NvmlMigBackend
from ..mig.profiles import UnknownTable, live_table, named_table
from ..mig.provision import MigProvisioner
from ..modes.mig import DEFAULT_CHECKPOINT_DIR
from ..table_fit import tabular
from .common import NEGATIVE, NOTHING_TO_READ, OK, USAGE, CommandError, failing


def _gpu(selector: str, hint: str = ""):
    """The GPU named by index or UUID, or exit with why not."""
    reason = nvml.init()
    gpus = [] if reason else nvml.gpus()
    if not gpus:
        raise CommandError(f"no GPU ({reason or 'NVML sees none'}){hint}", NOTHING_TO_READ)
    gpu = nvml.find_gpu(selector, gpus)
    if gpu is None:
        raise CommandError(f"no GPU {selector!r}; present: {nvml.describe_gpus(gpus)}", USAGE)
    return gpu


def _mig_table(args):
    if args.table:
        with failing(UnknownTable, USAGE):
            return named_table(args.table)
    gpu = _gpu(args.gpu, "; name a table with --table (h200, h100-80gb, a100-40gb, a100-80gb)")
    return live_table(gpu.uuid, gpu.name)


def cmd_mig_profiles(args) -> int:
    table = _mig_table(args)
    if args.format == "json" or args.json:
        print(json.dumps(table.to_dict(), indent=1))
        return OK
    rows = [[p.name, p.profile_id, p.nvml_index, p.slice_count, p.instance_count, p.memory_mb,
             p.multiprocessor_count, "{" + ",".join(map(str, p.starts)) + "}:" + str(p.size)] for p in table.profiles]
    headers = ["profile", "id", "nvml index", "compute slices", "instances", "memory MB", "SMs", "placements"]
    if args.format != "csv":
        print(f"{table.gpu} ({table.source}): {table.compute_slices} compute slices, "
              f"{table.memory_slices} memory slices")
    print(tabular(rows, headers, args.format))
    return OK


def cmd_mig_plan(args) -> int:
    table = _mig_table(args)
    with failing(planner.LayoutError, USAGE):
        plan = planner.plan(table, planner.parse_layout(args.layout))
    print(f"{args.layout} on {table.gpu}:")
    print(plan.explain())
    return OK if plan.feasible else NEGATIVE


def cmd_mig_restore(args) -> int:
    gpu = _gpu(args.gpu)
    provisioner = MigProvisioner(NvmlMigBackend(gpu.uuid), live_table(gpu.uuid, gpu.name), gpu.uuid, gpu.index,
                                 allow_reconfigure=True,
                                 checkpoint_dir=Path(args.checkpoint_dir or DEFAULT_CHECKPOINT_DIR))
    print("restored the saved MIG layout" if provisioner.recover() else "no saved MIG layout to restore")
    return 0
