"""What a session says at its end: the scenarios' table with its notes, the gate's verdicts, and the gate's Markdown
report for CI. A plugin registered beside the session (``plugin.py``) that reads its results."""
from __future__ import annotations

from pathlib import Path

import pytest

from . import gate_table, preamble, record, report
from .history import run_number
from .session import CPU_BATCH_CAP, CPU_IMAGE_SIZE, CollocSession
from .table_fit import terminal_width, wrapped
from .words import CPU_SMOKE
from .workloads import SMOKE_SEQ_LEN


class Summary:
    def __init__(self, session: CollocSession):
        self.session = session

    @pytest.hookimpl(tryfirst=True)  # before the session's own: a report that cannot be written fails the run
    def pytest_sessionfinish(self, session, exitstatus):
        """The verdicts as Markdown (CI job summaries)."""
        s = self.session
        path = s.options.colloc_gate_report
        if not (path and s.invited and s.xdist_index is None and s.history is not None):
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            table = gate_table.table(self._shown_verdicts(), "github") if s.verdicts else ""
            left = "".join(f"\n{line}\n" for line in self._unjudged_lines())
            smoke = f"\n{CPU_SMOKE}\n" if s.device().gpu is None else ""
            Path(path).write_text(f"### Collocation regression gate\n{smoke}\n{table}\n{left}")
        except OSError as error:
            s.save_problems.append(f"could not write the gate report to {path}: {error}")

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        s = self.session
        if not s.invited:
            return
        width = terminal_width()

        def say(text: str, **markup) -> None:  # prose, wrapped to the width the tables fit
            terminalreporter.write_line(wrapped(text, width), **markup)

        for problem in s.save_problems:
            say(f"gpucolloc: {problem}", red=True)
        if not (s.results or s.forwarded or s.alone_measured or s.skipped):
            # gated, yet no scenario ran and no test failed: the gate did not pass, and says why (a failure says it)
            if s.history is not None and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED,
                                                        pytest.ExitCode.INTERRUPTED):
                self._gate_summary(terminalreporter, width, say, exitstatus == pytest.ExitCode.INTERRUPTED)
            return
        terminalreporter.write_sep("-", "gpucolloc: collocation scenarios")
        device = s.device()
        say(device.reason)
        if device.gpu is None:  # what a user asked for is not what ran: say so where the numbers are
            say(f"CPU smoke mode ran smaller jobs than asked: images of {CPU_IMAGE_SIZE} px, batches capped at "
                f"{CPU_BATCH_CAP}, language models at {SMOKE_SEQ_LEN} tokens; its numbers check the suite, not a GPU")
        say(s.machine_warmup.describe() if s.machine_warmup is not None
            else preamble.machine_warmup_line(s).removeprefix("gpucolloc: "))
        if every := s.options.colloc_extra_step_every:
            say(f"--colloc-extra-step-every={every}: every job slowed on purpose to check the gate; a run saved is "
                "marked so: judged, and in `history`, but no later run's baseline", yellow=True)
        if device.gpu is None:
            say("telemetry sampler: off (no GPU)")
        elif not s.options.colloc_telemetry:
            say("telemetry sampler: off (--colloc-telemetry=off)")
        # the summary shows exactly what is saved: each result through the record's writer and reader
        entries = [(f"alone: {result.workloads[0].label}", record.read(record.write(result)))
                   for _, result in s.alone_measured]
        entries += [(name, record.read(record.write(result, verdict))) for name, result, verdict in s.results]
        entries += [(name, record.read(info)) for name, info in s.forwarded]
        if entries:
            shown = report.columns(s.options.colloc_columns, report.COLUMNS) if s.options.colloc_columns else None
            terminalreporter.write_line(report.table(entries, shown=shown, width=width, ask="--colloc-columns"))
        for name, scenario in entries:
            for warning in scenario.warnings:
                say(f"warning: {name}: {warning}", yellow=True)
        for term in ((["alone: each distinct job measured alone once per session (the sequential mode's results and "
                       "every speedup's reference)", "speedup: sum of each job's throughput relative to running alone"]
                      if s.options.colloc_alone else ["alone: off (--colloc-alone=off): no job was measured alone, so "
                                                      "the speedups are left out (-)"])
                     + ["CV: round-to-round spread of aggregate throughput",
                        "rounds: taken until the mean was known within --colloc-precision (or the most rounds, or "
                        "while it was within reach)",
                        "start-up s: spawn to every worker warm ('= alone': a sequential scenario, or one job under "
                        "naive, '= mps': one mps-partitioned client has the whole GPU; each records that measurement, "
                        "taken once)"]) * bool(entries):  # the table's words, where there is a table
            say(term)
        if s.results:  # its table follows: say what its times are where it is printed
            say("pytest-benchmark's table times each round as the time per sample (1 / the aggregate samples/s, in "
                "its unit: a slower scenario shows a longer time; its OPS are samples/s), so that "
                "--benchmark-compare-fail sees a slowdown")
        if s.results and not (config.getoption("benchmark_save", None)
                              or config.getoption("benchmark_autosave", None)
                              or config.getoption("benchmark_disable", None)):  # said why by its own line
            say(  # a first-time user's runs would otherwise leave no history, silently
                "gpucolloc: this run was not saved, so no later run can be compared or gated against it: add "
                "--benchmark-autosave (or gate it: --colloc-gate saves too)", yellow=True)
        served = report.serving_table(entries, width=width,
                                      ask=f"the report: pytest-gpucolloc report {self._saved_run()}")
        if served:
            terminalreporter.write_line(served)
            for name, why in report.saturated(entries):
                say(f"saturated: {name}: {why}", yellow=True)
            for term in ("serving: latency from each request's scheduled arrival to its answer (open loop), over every "
                         "request measured", "p99 vs alone: against the same service alone at the same rate",
                         "SMs reserved: the service's share of the SMs (mps-partitioned; the training jobs share the "
                         "rest)", "training kept: the training jobs' mean share of their throughput alone"):
                say(term)
        if spent := report.time_spent([scenario for _, scenario in entries], s.settings().round_s):
            say(spent)
        for name, scenario in entries:  # data loading: the cores each job got, and whether they were enough
            if any(w.data_wait_share is not None for w in scenario.workers):
                say(f"data wait (time spent waiting for the next batch) and CPU cores of "
                    f"{name}: {scenario.cpu_affinity}")
        for name, why in s.skipped:
            say(f"skipped {name}: {why}")
        if s.history is not None:
            self._gate_summary(terminalreporter, width, say, exitstatus == pytest.ExitCode.INTERRUPTED)

    def _gate_summary(self, terminalreporter, width: int, say, interrupted: bool) -> None:
        s = self.session
        regressed = [name for name, v in s.verdicts if v.failed]
        if interrupted and s.nothing_gated():  # stopped before any scenario was judged: no gate ran
            terminalreporter.write_sep("!", "gpucolloc gate: interrupted before any scenario was judged", red=True)
        elif s.nothing_gated():
            terminalreporter.write_sep("!", "gpucolloc gate: no scenario judged, exit code 5: the gate did not pass",
                                       red=True)
        else:  # a first run has nothing to be judged against: it passes, saying so, so that a history can start
            first = sum(v.verdict == "no baseline" for _, v in s.verdicts)
            terminalreporter.write_sep(
                "-", f"gpucolloc gate: {'interrupted; ' if interrupted else ''}{len(regressed)} regressed of "
                f"{len(s.verdicts)}"
                + (f"; {first} with no baseline yet" if first else ""), yellow=bool(first) and not regressed)
            if first:  # --benchmark-disable saves nothing, so starts nothing
                say("a scenario with no baseline yet is saved to start its history, and passes" if s.saved else
                    "a scenario with no baseline yet passes; this run was not saved, so it starts no history")
        if s.device().gpu is None and s.verdicts:
            say(CPU_SMOKE)
        for line in self._unjudged_lines():
            say(line)
        for problem in s.history.problems if s.history else []:
            say(f"history: {problem}")
        for name, verdict in s.verdicts:
            if verdict.remeasured:
                say(f"measured again before judging {name}: {'; '.join(verdict.remeasured)}")
        if s.verdicts:  # none: the lines above said why, and an empty table would say nothing more
            terminalreporter.write_line(gate_table.table(self._shown_verdicts(), width=width,
                                                         ask=f"pytest-gpucolloc gate {self._saved_run()} --columns"))
        if regressed:
            if not s.options.colloc_extra_step_every:  # slowed on purpose: never a baseline, nothing to accept
                say(gate_table.ACCEPT_HINT.format(run=self._saved_run()))

    def _saved_run(self) -> str:
        """The run saved now as a command names it: its number (and storage where not the default), else RUN."""
        s = self.session
        if not s.saved:
            return "RUN"
        storage = s.saved[-1].parent.parent
        where = "" if storage.resolve() == Path(".benchmarks").resolve() else f" --storage {storage}"
        number = run_number(s.saved[-1].stem)
        alone = len(list(storage.glob(f"*/{number}_*.json"))) == 1  # another machine's folder may hold one too
        return (number if alone else s.saved[-1].stem) + where

    def _unjudged_lines(self) -> list[str]:
        """What the gate did not judge, for the summary and the gate report."""
        s = self.session
        lines = []
        if not s.verdicts:  # a gate that passes without judging anything must say why
            why = [f"{len(s.measured_for_ab)} left to paired A/B"] * bool(s.measured_for_ab)
            why += [f"{len(s.skipped)} skipped"] * bool(s.skipped)
            if not (why or s.results or s.forwarded):
                why = ["no collocation scenario was measured (none collected, all deselected, or each failed first)"]
            said = "".join(f"\n  skipped {name}: {reason}" for name, reason in s.skipped[:3])
            lines.append("no scenario was judged against history" + (f": {', '.join(why)}" if why else "") + said
                         + "\n  ..." * (len(s.skipped) > 3))
        if s.measured_for_ab:
            lines.append(gate_table.left_to_ab_line(s.measured_for_ab, s.options.gpu_mode or ()))
        return lines

    def _shown_verdicts(self) -> list[tuple[str, dict]]:
        return [(name, verdict.to_dict()) for name, verdict in self.session.verdicts]  # as saved, as ``compare`` shows
