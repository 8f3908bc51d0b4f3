"""Log files of the processes the plugin starts (workers, MPS daemons), read back for failure reports.

A workload may print without limit (one 50 MB line): a tail reads only the end of the file and cuts long lines,
so a failure report stays small whatever was printed.
"""
from __future__ import annotations

import os
from pathlib import Path

TAIL_BYTES = 64 * 1024
LINE_CHARS = 500


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, each cut to LINE_CHARS; empty if it cannot be read."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    kept = text.splitlines()[-lines:]
    return "\n".join(line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]}... ({len(line):,} characters)"
                     for line in kept)
