"""Saved runs, read from pytest-benchmark's file storage (``.benchmarks/<machine>/NNNN_*.json``).

Read-only: files are never modified. A file that cannot be read or has no benchmarks is reported by name
and skipped.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .gate import RunSample


@dataclass
class SavedRun:
    path: Path
    run_id: str  # the file's name without .json
    datetime: str
    commit: str | None
    machine: dict  # machine_info["gpucolloc"]
    scenarios: dict[str, dict]  # benchmark fullname -> extra_info (this plugin's scenarios only)

    def sample(self, fullname: str) -> RunSample | None:
        info = self.scenarios.get(fullname)
        if not info or not info.get("aggregate_round_throughputs"):
            return None
        gpu = info.get("gpu") or {}  # the GPU the scenario ran on (xdist runs use several)
        return RunSample(self.run_id, tuple(info["aggregate_round_throughputs"]),
                         gpu.get("name", self.machine.get("gpu_name")), gpu.get("uuid", self.machine.get("gpu_uuid")),
                         info.get("throttled"), self.datetime, self.commit,
                         bool(info.get("foreign_pids")))


@dataclass
class History:
    runs: list[SavedRun] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "path: why it was skipped"

    def samples(self, fullname: str, exclude: set[str] = frozenset()) -> list[RunSample]:
        found = (run.sample(fullname) for run in self.runs if run.run_id not in exclude)
        return [s for s in found if s is not None]


def storage_path(option: str | None) -> Path | None:
    """The folder behind ``--benchmark-storage`` (file storage only), or None for other backends."""
    text = option or "file://./.benchmarks"
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    if "://" in text:
        return None
    return Path(text)


def read_run(path: Path) -> SavedRun:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError("not a pytest-benchmark file (no benchmarks list)")
    scenarios = {b["fullname"]: b["extra_info"] for b in data["benchmarks"]
                 if isinstance(b, dict) and isinstance(b.get("extra_info"), dict) and b["extra_info"].get("gpucolloc")}
    commit = (data.get("commit_info") or {}).get("id")
    return SavedRun(path, path.stem, data.get("datetime", ""), commit,
                    (data.get("machine_info") or {}).get("gpucolloc", {}), scenarios)


def load(root: Path) -> History:
    history = History()
    if not root.exists():
        return history
    for path in sorted(root.rglob("*.json")):
        try:
            run = read_run(path)
        except (OSError, ValueError, KeyError, TypeError) as error:  # JSONDecodeError is a ValueError
            history.problems.append(f"{path}: skipped ({type(error).__name__}: {str(error)[:120]})")
            continue
        if run.scenarios:
            history.runs.append(run)
    history.runs.sort(key=lambda r: r.datetime)
    return history


def guard_saving(storage, problems: list[str]) -> None:
    """Make pytest-benchmark's file storage save without ever overwriting or losing a run.

    Its own save picks the next number, checks that the name is free, then writes in place: two runs saving at
    once can collide, and a full disk leaves a truncated file. Here the file is written aside and linked into
    place atomically (``os.link`` fails if the name was taken meanwhile: the next number is tried); if it cannot
    be saved at all, the data goes to a temporary file and the reason is appended to ``problems``."""
    if not (hasattr(storage, "get") and hasattr(type(storage), "_next_num")):
        return  # not the file storage: leave it alone

    def save(output_json, save_name):
        from pytest_benchmark.utils import safe_dumps

        data = safe_dumps(output_json, ensure_ascii=True, indent=4).encode()
        try:
            for _ in range(1000):
                path = storage.get(f"{storage._next_num}_{save_name}.json")
                aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                try:
                    aside.write_bytes(data)
                    os.link(aside, path)
                except FileExistsError:
                    continue  # another run took this number between our look and our write
                finally:
                    aside.unlink(missing_ok=True)
                storage.logger.info(f"Saved benchmark data in: {path}")
                return
            raise OSError("no free run number after 1000 attempts")
        except OSError as error:
            fallback = Path(tempfile.mkstemp(prefix="pytest-gpucolloc-unsaved-", suffix=".json")[1])
            fallback.write_bytes(data)
            problems.append(f"could not save this run into {storage.path}: {error}; its data is kept at {fallback}")

    storage.save = save
