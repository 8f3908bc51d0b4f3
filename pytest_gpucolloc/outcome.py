"""What a decision says of a scenario: one vocabulary for the history gate, the paired A/B and ``compare``.

The gate can say all six; a paired A/B says one of the first four (both arms are measured on this machine, now).
"""
from typing import Literal

Outcome = Literal["regressed", "improved", "unchanged", "inconclusive", "no baseline", "not comparable"]
