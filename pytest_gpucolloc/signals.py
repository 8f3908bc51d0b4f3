"""Signals the plugin turns into something a user can rely on: SIGTERM (a CI job cancelled) unwinds as Ctrl-C
does, and a run being saved is not cut short."""
from __future__ import annotations

import contextlib
import os
import signal


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (a CI job cancelled) unwinds like Ctrl-C: worker processes stopped, worktrees and sockets removed."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_deferred():
    """SIGTERM and Ctrl-C wait until the block has finished (a run being saved is saved whole); yields the names of
    those that arrived. A second one acts at once: a block that hangs can still be stopped."""
    arrived = []

    def defer(signum, frame):
        arrived.append(signal.Signals(signum).name)
        signal.signal(signum, previous[signum])
        # said at once: a save of a long run can take a while, and a silent Ctrl-C reads as one that did nothing
        os.write(2, f"\n{arrived[-1]}: stopping once the run is saved; again to stop at once\n".encode())

    try:
        previous = {sig: signal.signal(sig, defer) for sig in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread
        yield arrived
        return
    try:
        yield arrived
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
