"""CPU affinity: which cores each worker (training process) may use.

CPU placement is part of what is measured for launch-bound workloads, so it is decided here,
explicitly, and recorded with every result.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass


class CpuListError(ValueError):
    pass


@dataclass(frozen=True)
class CpuPolicy:
    """``auto``: disjoint core sets, one spare core for the controller when there is room;
    ``none``: no pinning; ``explicit``: the given core sets, one per worker (may overlap: asked for)."""

    kind: str = "auto"
    explicit: tuple[tuple[int, ...], ...] = ()


def parse_cpu_policy(text: str) -> CpuPolicy:
    """``auto`` | ``none`` | ``"0-3;4-7;8,9"`` (one core list per worker, ``;``-separated)."""
    text = (text or "").strip()
    if text in ("", "auto", "none"):
        return CpuPolicy(text or "auto")
    sets = []
    for group in text.split(";"):
        cores: set[int] = set()
        for part in group.split(","):
            low, dash, high = part.strip().partition("-")
            try:
                first, last = int(low), int(high if dash else low)
                if last < first:
                    raise ValueError
            except ValueError:
                raise CpuListError(f"invalid CPU list {group!r} in {text!r}: expected 'auto', 'none' or core lists "
                                   "such as '0-3;4-7'") from None
            cores.update(range(first, last + 1))
        if not cores or min(cores) < 0 or max(cores) > 4095:
            raise CpuListError(f"invalid CPU list {group!r}: cores must be between 0 and 4095")
        sets.append(tuple(sorted(cores)))
    return CpuPolicy("explicit", tuple(sets))


def check_cores(policy: CpuPolicy, available: list[int] | None = None) -> None:
    """Explicit core lists must name cores this process may use: a usage error before anything starts."""
    available = sorted(available if available is not None else os.sched_getaffinity(0))
    missing = sorted({c for cores in policy.explicit for c in cores} - set(available))
    if missing:
        raise CpuListError(f"--colloc-cpus names cores {missing} that this process may not use "
                           f"(it may use {', '.join(map(str, available))})")


@dataclass(frozen=True)
class Assignment:
    cpus: list[tuple[int, ...] | None]  # per worker; None: not pinned
    note: str


def assign_cpus(n_workers: int, policy: CpuPolicy, available: list[int] | None = None,
                wants: list[int] | None = None) -> Assignment:
    """Cores per worker. ``auto`` splits the cores (less one for the controller when there is room) in proportion to
    each job's ``wants`` (``Workload.cores_wanted``), never two workers on a core, saying when they want more."""
    available = sorted(available if available is not None else os.sched_getaffinity(0))
    wants = wants or [1] * n_workers
    if policy.kind == "none":
        return Assignment([None] * n_workers, "not pinned (--colloc-cpus=none)")
    if policy.kind == "explicit":
        if len(policy.explicit) < n_workers:
            raise CpuListError(f"--colloc-cpus gives {len(policy.explicit)} core lists for {n_workers} workers")
        check_cores(policy, available)
        return Assignment(list(policy.explicit[:n_workers]), "explicit (--colloc-cpus)")
    if len(available) < n_workers:
        return Assignment([None] * n_workers, f"not pinned: {n_workers} workers but only {len(available)} cores "
                                              "(never two workers per core)")
    cores = available[1:] if len(available) > n_workers else available  # keep one core for the controller
    if len(set(wants)) == 1:  # alike jobs get alike shares (what is left over stays free)
        counts = [len(cores) // n_workers] * n_workers
    else:
        counts = [max(1, len(cores) * want // sum(wants)) for want in wants]
        while sum(counts) > len(cores):  # the floor of 1 overshot: take from the largest share
            counts[counts.index(max(counts))] -= 1
    sets: list[tuple[int, ...] | None] = [tuple(cores[start:start + count])
                                          for start, count in zip(itertools.accumulate(counts, initial=0), counts)]
    note = (f"auto: {counts[0]} core(s) per worker" if len(set(counts)) == 1
            else "auto: " + ", ".join(map(str, counts)) + " cores for the workers in order")
    if sum(wants) > len(cores):
        note += (f"; the jobs want {sum(wants)} cores (a training process and its data-loader workers each) but only "
                 f"{len(cores)} can be given: data-loader workers share cores")
    return Assignment(sets, note)
