"""Pure MIG layout planning: a layout in NVIDIA's vocabulary -> explicit placements, or plain reasons
why it cannot exist on this GPU (and a layout that would)."""
from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field

from .profiles import Profile, ProfileTable, table_for_gpu

# The paper's homogeneous layouts: N processes -> one instance each.
DEFAULT_SLICES = {1: 7, 2: 3, 3: 2, 4: 1, 5: 1, 6: 1, 7: 1}
_ITEM = re.compile(r"^(\d+g(?:\.\d+gb)?(?:\+me)?)(?:\*(\d+))?$", re.ASCII)
MAX_INSTANCES = 7


class LayoutError(ValueError):
    """The layout text itself is malformed."""


def parse_layout(text: str) -> list[str]:
    """``"3g.71gb,2g.35gb,1g.18gb*2"`` -> ``["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]``."""
    if not isinstance(text, str) or not text.strip():
        raise LayoutError("a MIG layout must be a non-empty comma-separated list such as '3g,2g,1g*2'")
    items: list[str] = []
    for part in text.split(","):
        match = _ITEM.match(part.strip())
        if not match:
            raise LayoutError(f"invalid MIG layout item {part.strip()!r} in {text!r}: expected e.g. '3g', "
                              "'3g.71gb' or '1g*2'")
        count = int(match.group(2) or 1)
        if not 1 <= count <= MAX_INSTANCES:
            raise LayoutError(f"invalid count in {part.strip()!r}: between 1 and {MAX_INSTANCES}")
        items += [match.group(1)] * count
    if len(items) > MAX_INSTANCES:
        raise LayoutError(f"{len(items)} instances: a GPU holds at most {MAX_INSTANCES} MIG instances")
    return items


def default_layout(n_workers: int) -> list[str]:
    if n_workers not in DEFAULT_SLICES:
        raise LayoutError(f"no default MIG layout for {n_workers} workers (at most {MAX_INSTANCES}); give one")
    return [f"{DEFAULT_SLICES[n_workers]}g"] * n_workers


@dataclass(frozen=True)
class Placement:
    profile: Profile
    start: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.profile.size)

    def describe(self) -> str:
        return f"{self.profile.name} at memory slices {self.start}-{self.start + self.profile.size - 1}"


@dataclass
class Plan:
    gpu: str
    placements: list[Placement] = field(default_factory=list)  # in request order; empty if infeasible
    reasons: list[str] = field(default_factory=list)
    alternative: list[str] | None = None

    @property
    def feasible(self) -> bool:
        return not self.reasons

    def explain(self) -> str:
        if self.feasible:
            return "\n".join(f"  {i}: {p.describe()}  ({p.profile.multiprocessor_count} SMs, "
                             f"{p.profile.memory_mb} MB)" for i, p in enumerate(self.placements))
        text = f"does not fit on {self.gpu}: " + "; ".join(self.reasons)
        if self.alternative:
            text += f". A layout that fits: {','.join(self.alternative)}"
        return text


def plan(table: ProfileTable, layout: list[str]) -> Plan:
    result = Plan(table.gpu)
    resolved = [(item, table.resolve(item)) for item in layout]
    result.reasons = [f"profile {item!r} is unknown on this GPU (it offers {', '.join(table.names())})"
                      for item, profile in resolved if profile is None]
    if result.reasons:
        return result
    profiles = [profile for _, profile in resolved if profile is not None]
    result.reasons = _budget_reasons(table, profiles)
    found = None if result.reasons else _place(table, profiles)
    if found is not None:
        result.placements = found
    else:
        if not result.reasons:
            result.reasons.append("no placement keeps their memory slices apart (" + ", ".join(
                f"{p.name} may start at {list(p.starts)} and spans {p.size}" for p in dict.fromkeys(profiles)) + ")")
        result.alternative = _alternative(table, profiles)
    return result


def _budget_reasons(table: ProfileTable, profiles: list[Profile]) -> list[str]:
    reasons = []
    compute = sum(p.slice_count for p in profiles)
    if compute > table.compute_slices:
        terms = "+".join(p.short for p in profiles)
        reasons.append(f"{terms} needs {compute} compute slices of {table.compute_slices}")
    for profile, count in Counter(profiles).items():
        if count > profile.instance_count:
            reasons.append(f"{count} x {profile.name} but the GPU allows {profile.instance_count}")
    memory = sum(p.size for p in profiles)
    if memory > table.memory_slices:
        reasons.append(f"they occupy {memory} memory slices of {table.memory_slices}")
    return reasons


def _place(table: ProfileTable, profiles: list[Profile]) -> list[Placement] | None:
    """Backtracking over the allowed starts, largest instances first; deterministic."""
    order = sorted(range(len(profiles)), key=lambda i: (-profiles[i].size, -profiles[i].slice_count, i))
    chosen: dict[int, Placement] = {}
    used: set[int] = set()

    def search(k: int) -> bool:
        if k == len(order):
            return True
        index = order[k]
        profile = profiles[index]
        for start in profile.starts:
            span = set(range(start, start + profile.size))
            if span & used or max(span) >= table.memory_slices:
                continue
            used.update(span)
            chosen[index] = Placement(profile, start)
            if search(k + 1):
                return True
            used.difference_update(span)
            del chosen[index]
        return False

    return [chosen[i] for i in range(len(profiles))] if search(0) else None


def _alternative(table: ProfileTable, profiles: list[Profile]) -> list[str] | None:
    """A nearby layout that fits: shrink instances (largest first) by whole profiles, fewest changes."""
    smaller = {p.name: sorted((q for q in table.profiles
                               if q.slice_count < p.slice_count and not q.name.endswith("+me")),
                              key=lambda q: -q.slice_count)
               for p in profiles}
    for changes in range(1, len(profiles) + 1):
        for positions in itertools.combinations(sorted(range(len(profiles)), key=lambda i: -profiles[i].slice_count),
                                                changes):
            options = [smaller[profiles[i].name] for i in positions]
            for replacement in itertools.product(*options):
                candidate = list(profiles)
                for i, new in zip(positions, replacement):
                    candidate[i] = new
                if not _budget_reasons(table, candidate) and _place(table, candidate) is not None:
                    return [p.name for p in candidate]
    return None


def why_it_cannot_exist(gpu_name: str | None, sizes: list) -> str | None:
    """Why one MIG instance of each of these sizes (the jobs' ``mig``) cannot exist on this GPU model, by its
    in-repo profile table; None when it fits, a job names no size, or the model has no table."""
    table = table_for_gpu(gpu_name or "")
    if table is None or not sizes or not all(sizes):
        return None
    try:
        result = plan(table, list(sizes))
    except (LayoutError, KeyError, ValueError):
        return None
    return None if result.feasible else result.explain()

