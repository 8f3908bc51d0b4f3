"""Every use of pytest-benchmark's private API, in one place: a scenario's rounds put into the ``benchmark``
fixture's statistics directly (worker processes measure, not a called function), an xdist worker's scenarios rebuilt
in the controller's session, and its file storage's saving made atomic."""
from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

from . import index

MODE = "pytest-gpucolloc"


def storage_path(option: str | None) -> Path | None:
    """The folder behind ``--benchmark-storage`` (file storage only), or None for other backends."""
    text = (option or "file://./.benchmarks").removeprefix("file://")
    return None if "://" in text else Path(text)


def missing_storage_client(option: str) -> bool:
    """Whether ``--benchmark-storage`` names pytest-benchmark's elasticsearch backend without its client library
    installed (pytest-benchmark then fails inside its own set-up)."""
    return option.startswith("elasticsearch+") and importlib.util.find_spec("elasticsearch") is None


def autosave(config) -> bool:
    """Turn on ``--benchmark-autosave`` unless the run already saves or records nothing (``--benchmark-disable``);
    whether it was turned on here."""
    from pytest_benchmark.utils import get_tag

    if config.getoption("benchmark_save", None) or config.getoption("benchmark_autosave", None) \
            or disabled_by_user(config):
        return False
    config.option.benchmark_autosave = get_tag()
    return True


def record_rounds(benchmark, seconds_per_sample: list[float]) -> None:
    """Put one value per measurement round into the fixture's statistics."""
    stats = benchmark._make_stats(1)
    for value in seconds_per_sample:
        stats.update(value)
    benchmark._mode = MODE


def mark_used(benchmark, how: str) -> None:
    """The fixture ran although nothing is recorded here: not pytest-benchmark's "fixture was not used"."""
    benchmark._mode = f"{MODE} ({how})"


def disabled_by_user(config) -> bool:
    """``--benchmark-disable`` as given (not pytest-benchmark turning itself off under xdist)."""
    return bool(config.getoption("benchmark_disable", False)) and not config.getoption("benchmark_enable", False)


# Fields of pytest-benchmark's own machine_info that change from run to run on one machine.
VOLATILE = {"cpu": {"hz_actual", "hz_actual_friendly"}}


def machine_differences(saved: dict, current: dict) -> list[str]:
    """What differs in pytest-benchmark's own machine_info (``python_version 3.11.7 -> 3.12.1``), volatile fields,
    this plugin's identity and keys only one side has left out."""
    def flat(info: dict) -> dict:
        items = {}
        for key, value in info.items():
            if key == "gpucolloc":
                continue
            if isinstance(value, dict):
                items.update({f"{key}.{k}": v for k, v in value.items() if k not in VOLATILE.get(key, ())})
            else:
                items[key] = value
        return items

    before, after = flat(saved), flat(json.loads(json.dumps(current, default=str)))  # as saved: tuples are lists
    return [f"{key} {str(before[key])[:60]} -> {str(after[key])[:60]}"
            for key in before if key in after and before[key] != after[key]]


def add_to_session(config, entry: dict) -> None:
    """Rebuild a scenario an xdist worker measured in the controller's pytest-benchmark session."""
    from pytest_benchmark.stats import Metadata

    if disabled_by_user(config):
        return  # pytest-benchmark records nothing in this run
    fixture = SimpleNamespace(name=entry["name"], fullname=entry["fullname"], group=entry["group"],
                              param=entry["param"], params=entry["params"], extra_info=entry["extra_info"],
                              cprofile_stats=None, has_error=False)
    record = Metadata(fixture, iterations=1, options={"source": f"{MODE} (xdist worker)"})
    for value in entry["data"]:
        record.update(value)
    config._benchmarksession.benchmarks.append(record)


def file_storage(config):
    """pytest-benchmark's storage of this session, or None (not set up, or pytest-benchmark is off)."""
    return getattr(getattr(config, "_benchmarksession", None), "storage", None)


def next_number(folder: Path) -> str:
    """The number the next run saved in ``folder`` takes: one past the highest, four digits or more (pytest-benchmark's
    own finds only four-digit numbers: from 9999 on it gives every run 10000)."""
    numbers = [int(p.name.split("_", 1)[0]) for p in folder.glob("[0-9]*_*.json") if p.name.split("_", 1)[0].isdigit()]
    return f"{max(numbers, default=0) + 1:04d}"


def guard_saving(storage, problems: list[str], saved: list[Path]) -> None:
    """Make pytest-benchmark's file storage save without ever overwriting or losing a run (its own save writes in
    place after checking the name: runs saving at once collide, a full disk truncates): written aside, then linked
    into place; a run that cannot be saved goes to a temporary file, saying why in ``problems``."""
    if not (hasattr(storage, "get") and hasattr(type(storage), "_next_num")):  # pytest-benchmark's FileStorage
        return  # not the file storage: leave it alone

    def save(output_json, save_name):
        from pytest_benchmark.utils import safe_dumps

        data = safe_dumps(output_json, ensure_ascii=True, indent=4).encode()
        try:
            folder = storage.get(save_name).parent  # the machine's folder, made where missing
            with index.locked(folder):  # jobs saving at once: else two runs of other names took one number
                for _ in range(1000):
                    path = folder / f"{next_number(folder)}_{save_name}.json"
                    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                    try:
                        aside.write_bytes(data)
                        os.link(aside, path)
                    except FileExistsError:
                        continue  # a run saved without the lock (pytest-benchmark's own) took this number
                    finally:
                        aside.unlink(missing_ok=True)
                    storage.logger.info(f"Saved benchmark data in: {path}")
                    saved.append(path)
                    return
            raise OSError("no free run number after 1000 attempts")
        except OSError as error:
            fallback = Path(tempfile.mkstemp(prefix="pytest-gpucolloc-unsaved-", suffix=".json")[1])
            fallback.write_bytes(data)
            problems.append(f"could not save this run into {storage.path}: {error}; its data is kept at {fallback}")

    storage.save = save


def latest_saved(root: Path) -> list[Path]:
    """The runs ``--benchmark-compare`` without a value chooses among, in its order (it takes the last)."""
    from pytest_benchmark.utils import get_machine_id

    return sorted((root / get_machine_id()).glob("[0-9][0-9][0-9][0-9]_*.json"), key=lambda path: path.name)
