"""Log files of the processes the plugin starts (workers, MPS daemons), read back for failure reports."""
from __future__ import annotations

from pathlib import Path


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file; empty if it cannot be read."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
