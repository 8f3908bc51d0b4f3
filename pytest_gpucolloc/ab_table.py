"""An A/B's verdicts as a table: whole in Markdown, and in a terminal or CI log short cells (a long reason numbered
and said below) and the least important columns left out until it fits, as the gate's and compare's tables do."""
from __future__ import annotations

from .report import cell, change, interval
from .table_fit import fitted_table

COLUMNS = ["scenario", "measure", "verdict", "blocks", "pairs", "change", "interval", "p", "detectable", "why"]
HEADERS = ["scenario", "measure", "verdict", "blocks", "pairs", "change (candidate vs baseline)", "interval",
           "p (slower)", "detectable worsening", "why"]
TERMINAL_HEADERS = [n if n != "p" else "p (slower)" for n in COLUMNS]  # the title says what a change is against
# left out first where a terminal is too narrow; never the scenario, its measure, the verdict, the change or why
DROP_ORDER = ["pairs", "p", "detectable", "blocks", "interval"]


def rows(judgements) -> list[list[str]]:
    """A row per judgement (``ab_judge.Judgement``), in ``COLUMNS``' order; a latency's measure with its ms."""
    return [[j.scenario, j.metric if j.ms is None else f"{j.metric} {j.ms[0]:.3g} -> {j.ms[1]:.3g} ms", j.verdict,
             str(j.blocks), str(j.pairs), change(j.change, 2), interval(j.ci, 2), cell(j.p_slower, ".2g"),
             ">1000%" if (j.detectable or 0) > 10 else cell(j.detectable, ".2%"), j.reason or "-"] for j in judgements]


def table(judgements, fmt: str = "simple", columns: list[str] | None = None, width: int | None = None) -> str:
    """The verdicts in ``fmt`` (a tabulate format; ``simple``: a terminal's), ``columns`` as asked, else what fits."""
    return fitted_table(rows(judgements), COLUMNS, TERMINAL_HEADERS if fmt == "simple" else HEADERS, DROP_ORDER, fmt,
                        width, "--columns", columns, ("why",), lambda full, _, __: " ".join(full[:3]))
