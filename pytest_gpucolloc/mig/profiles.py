"""MIG GPU-instance profile tables: read from NVML (``nvml_backend.read_profiles``) or one of the named tables
shipped in ``tables/`` (the captured H200 table and NVIDIA's MIG user guide for A100 and H100)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .nvml_backend import read_profiles

TABLES = Path(__file__).with_name("tables")
NAMED_TABLES = {path.stem: path for path in sorted(TABLES.glob("*.json"))}


@dataclass(frozen=True)
class Profile:
    name: str  # e.g. "3g.71gb"
    profile_id: int  # what NVML's create/query calls want (not the NVML_GPU_INSTANCE_PROFILE_* index)
    nvml_index: int | None
    slice_count: int  # compute slices
    instance_count: int  # how many of this profile the GPU allows at once
    memory_mb: int
    multiprocessor_count: int
    starts: tuple[int, ...]  # possible placements: first memory slice
    size: int  # memory slices one instance occupies

    @property
    def short(self) -> str:
        return self.name.split(".")[0] + ("+me" if self.name.endswith("+me") else "")


@dataclass(frozen=True)
class ProfileTable:
    gpu: str
    profiles: tuple[Profile, ...]
    memory_slices: int = 8
    compute_slices: int = 7
    source: str = ""

    def by_name(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def by_id(self, profile_id: int) -> Profile | None:
        return next((p for p in self.profiles if p.profile_id == profile_id), None)

    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def resolve(self, text: str) -> Profile | None:
        """``"3g.71gb"`` exactly, or ``"3g"`` by compute slices: the plain profile (no media engines)
        with the least memory, so one suite runs on A100, H100 and H200 alike."""
        exact = self.by_name(text)
        if exact or "." in text:
            return exact
        wanted_me = text.endswith("+me")
        slices = text.removesuffix("+me").removesuffix("g")
        if not slices.isdigit():
            return None
        candidates = [p for p in self.profiles if p.slice_count == int(slices) and p.name.endswith("+me") == wanted_me]
        return min(candidates, key=lambda p: (p.memory_mb, p.size), default=None)

    def to_dict(self) -> dict:
        """As ``table_from_dict`` reads it."""
        return {"gpu": self.gpu, "source": self.source, "memory_slices": self.memory_slices,
                "compute_slices": self.compute_slices,
                "profiles": [{**{k: v for k, v in asdict(p).items() if k not in ("starts", "size")},
                              "placements": {"starts": list(p.starts), "size": p.size}} for p in self.profiles]}


def table_from_dict(data: dict) -> ProfileTable:
    profiles = tuple(Profile(
        name=_clean_name(p["name"], p["slice_count"], p["memory_mb"]), profile_id=int(p["profile_id"]),
        nvml_index=p.get("nvml_index"), slice_count=int(p["slice_count"]), instance_count=int(p["instance_count"]),
        memory_mb=int(p["memory_mb"]), multiprocessor_count=int(p["multiprocessor_count"]),
        starts=tuple(int(s) for s in p["placements"]["starts"]), size=int(p["placements"]["size"] or 0))
        for p in data["profiles"])
    return ProfileTable(data.get("gpu", "unknown GPU"), profiles, int(data.get("memory_slices", 8)),
                        int(data.get("compute_slices", 7)), data.get("source", ""))


def _clean_name(name: str | None, slices: int, memory_mb: int) -> str:
    """NVML names profiles 'MIG 1g.18gb'; older drivers give no name at all."""
    if name:
        return name.removeprefix("MIG ").strip()
    return f"{slices}g.{round(memory_mb / 1024)}gb"


class UnknownTable(ValueError):
    """A table name that is not one of NAMED_TABLES (a ValueError: its message reads as written)."""


def named_table(name: str) -> ProfileTable:
    if name not in NAMED_TABLES:
        raise UnknownTable(f"unknown MIG table {name!r}; known: {', '.join(NAMED_TABLES)}")
    return table_from_dict(json.loads(NAMED_TABLES[name].read_text()))


def table_for_gpu(gpu_name: str) -> ProfileTable | None:
    """The in-repo profile table of a GPU model, by the name NVML gives it (None: no table for it)."""
    for name in NAMED_TABLES:
        table = named_table(name)
        if table.gpu == gpu_name:
            return table
    return None


def live_table(gpu_uuid: str, gpu_name: str) -> ProfileTable:
    """The profile table the GPU itself reports (read-only NVML queries; work with MIG mode off)."""
    profiles = read_profiles(gpu_uuid)
    memory_slices = max((max(p["placements"]["starts"], default=0) + (p["placements"]["size"] or 0)
                         for p in profiles), default=8)
    return table_from_dict({"gpu": gpu_name, "source": "NVML (live)", "memory_slices": memory_slices,
                            "compute_slices": max((p["slice_count"] for p in profiles), default=7),
                            "profiles": profiles})
