"""The two ways a sharing mode's setup goes wrong, as the test sees them: a skip or a failure. Each mode's own errors
subclass one; a leaf module, so that the mode helpers import it without importing the registry."""
from __future__ import annotations


class ModeUnavailable(RuntimeError):
    """The mode cannot run this scenario here (e.g. a MIG layout that does not fit): the test is skipped."""


class ModeFailed(RuntimeError):
    """The mode was asked for and its setup or teardown failed (e.g. the MPS daemon did not start): the test fails."""
