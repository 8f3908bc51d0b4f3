"""pytest as a child process that a test interrupts with Ctrl-C, whatever started the suite: a suite started in
the background by a non-interactive shell has SIGINT ignored, its children inherit that, and the run under test
would never see the Ctrl-C the test sends."""
import sys

_CODE = ("import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "sys.exit(pytest.main())")


def pytest_command(*args: str) -> list[str]:
    return [sys.executable, "-c", _CODE, *args]
