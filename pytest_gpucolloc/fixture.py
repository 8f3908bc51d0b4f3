"""The ``collocate`` fixture, one scenario's path: check the workloads -> skip what does not run here -> each distinct
job measured alone (once per session and GPU) -> the scenario under the test's mode (under ``sequential`` the alone
measurements are the scenario) -> speedups -> the gate's verdict -> the record into pytest-benchmark."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from . import benchmark_api, distributed, gate, history, interleave, markers, measure, progress, record, run_warnings
from .device import release
from .forkserver import close_shared
from .modes import MODES, ModeFailed, ModeUnavailable
from .modes.sequential import SequentialMode
from .pool import WorkerFailed
from .samples import latency_sample_of, sample_of
from .scenario import (
    Pairing,
    ScenarioFailed,
    ScenarioResult,
    combine_repeats,
    counted,
    run_scenario,
    sequential_of,
    taken_once,
)
from .session import CollocSession, ScenarioContext
from .verdict import with_latency
from .workloads import BACK_TO_BACK, Workload, WorkloadError, as_workloads

diagnostics_key = pytest.StashKey[str]()  # a failed scenario's daemon logs, attached to its report


class CollocateFixture:
    """What the ``collocate`` fixture gives a test (``plugin.collocate``): one scenario per test."""

    def __init__(self, session: CollocSession, node, mode: str, benchmark, log_dir: Path):
        self.session, self.node, self.mode, self.benchmark, self.log_dir = session, node, mode, benchmark, log_dir
        self.mode_class = MODES[mode]  # what the mode says about itself (base.SharingMode's class attributes)
        self.used = False

    def __call__(self, workloads: Iterable[Workload | str], *, ideal: bool | None = None) -> ScenarioResult:
        if self.used:
            raise RuntimeError("collocate can run one scenario per test (one benchmark record each)")
        self.used = True
        began = time.monotonic()
        progress.begin(self.node.nodeid)
        ended: BaseException | None = None
        try:
            return self._scenario(workloads, ideal)
        except BaseException as error:
            ended = error
            # the test's outcome says why nothing was measured, not pytest-benchmark's "fixture was not used"
            benchmark_api.mark_used(self.benchmark, "the scenario did not run to the end")
            raise
        finally:  # passed or skipped, the next run's estimate of its time; not a failure's (a broken environment
            progress.end()  # fails within the second) nor a run cut short by Ctrl-C
            if ended is None or isinstance(ended, pytest.skip.Exception):
                self.session.seconds[self.node.nodeid] = time.monotonic() - began

    def _scenario(self, workloads, ideal: bool | None) -> ScenarioResult:
        jobs = self._jobs(workloads)
        self._skip_what_cannot_run_here(jobs)
        context = self.session.context(self.node)
        try:
            with self._outcome():
                reason = self.mode_class().unavailable_reason(context.target)
                if reason:
                    pytest.skip(f"{self.mode}: {reason}")
                jobs = self._rates_resolved(jobs, context)
                alone = self._alone(jobs, context)
                fresh = False  # measured by this scenario itself: it can be measured again
                if self.mode_class.alone:
                    result = sequential_of([alone[job.key()] for job in self._adapted(jobs, context)])
                else:
                    self._skip_what_does_not_fit(jobs, alone, context)
                    before = self._measured_before(jobs, context)
                    fresh = before is None
                    result = self._run(jobs, context) if before is None else before
                    if len(jobs) == 1:
                        key = (self.mode, *self._one_job_key(jobs, context))
                        self.session.baselines.one_job[key] = result
                ideal = self.session.options.colloc_ideal if ideal is None else ideal
                self._add_baselines(result, context, ideal)
                result.serving = self._serving(result, context)
                verdict = None
                if context.policy is not None:  # judged while the GPU is held: a disturbed run is measured again
                    result, verdict = self._judge(result, context, jobs if fresh else None, ideal)
        finally:
            release(context.target)
        self._record(result, verdict)
        return result

    @staticmethod
    def _jobs(workloads) -> list[Workload]:
        try:
            jobs = as_workloads(workloads)
        except WorkloadError as exc:
            pytest.fail(str(exc), pytrace=False)
        if not jobs:
            pytest.fail("collocate() needs at least one workload", pytrace=False)
        if sum(job.serves for job in jobs) > 1:
            pytest.fail("collocate() takes one serving job (rate=...) per scenario: its latency is the scenario's "
                        "to judge", pytrace=False)
        return jobs

    def _rates_resolved(self, jobs: list[Workload], context: ScenarioContext) -> list[Workload]:
        """A serving job's ``rate="80%"``: that share of the requests/s it answers back to back alone here. A rate
        too slow to answer a few requests in every round is refused, saying so (there would be nothing to judge)."""
        if not any(job.serves for job in jobs):
            return jobs
        from .serving import MIN_REQUESTS_PER_ROUND  # loaded with hdrhistogram only where a test has a service

        resolved = []
        round_s = context.settings.round_s
        for job in jobs:
            asked, share = job.rate, job.share_of_alone
            if share is not None:  # the job answering back to back alone here (measured once per session)
                flat_out = job.at_rate(BACK_TO_BACK)
                capacity = self._alone([flat_out], context, always=True)[context.settings.adapt(flat_out).key()]
                worker = capacity.workers[0]
                per_second = worker.stats.throughput / worker.ready.samples_per_step
                job = job.at_rate(max(round(share * per_second, 1), 0.1))
                # by the key of the job as the workers run it (the settings may change it: CPU smoke, cuDNN, ...)
                self.session.rates_asked[context.settings.adapt(job).key()] = \
                    f"{asked} of {per_second:,.1f}/s alone back to back"
            if isinstance(job.rate, (int, float)) and job.rate * round_s < MIN_REQUESTS_PER_ROUND:
                if share is not None and self.session.device().device == "cpu":
                    pytest.skip(f"CPU smoke mode: {job.label} answers {per_second:.2g} requests/s here "
                                f"back to back, so {asked} of it leaves fewer than {MIN_REQUESTS_PER_ROUND} requests "
                                f"a round of {round_s:g} s to measure; this service scenario runs on a GPU")
                pytest.fail(f"{job.label}: at {job.rate:g} requests/s a round of {round_s:g} s holds fewer than "
                            f"{MIN_REQUESTS_PER_ROUND} requests to measure: raise the rate or "
                            "--colloc-round-seconds", pytrace=False)
            resolved.append(job)
        return resolved

    def _serving(self, result: ScenarioResult, context: ScenarioContext) -> dict | None:
        """The serving job's latencies, the same job's alone at its rate (their reference), how its rate was chosen."""
        worker = next((w for w in result.workers if w.workload.serves), None)
        if worker is None or worker.serving is None:
            return None
        facts = worker.serving
        alone = self.session.baselines.alone.get((worker.workload.key(), self.session.device().key))
        alone_facts = alone.workers[0].serving if alone is not None else None
        facts.update(workload=worker.workload.label, rate_asked=self.session.rates_asked.get(worker.workload.key()))
        for key in ("p50_ms", "p99_ms", "round_p50_ms", "round_p99_ms", "saturated"):  # its own yardstick, gated too
            facts[f"alone_{key}"] = alone_facts.get(key) if alone_facts else None
        if facts["p99_ms"] and facts["alone_p99_ms"]:
            facts["p99_vs_alone"] = facts["p99_ms"] / facts["alone_p99_ms"]
        training = [w for w in result.workers if not w.workload.serves]
        kept = [w.stats.throughput / a for w, a in zip(result.workers, result.alone_throughputs or [])
                if not w.workload.serves and a]
        facts["training_jobs"] = len(training)
        facts["training_throughput"] = sum(w.stats.throughput for w in training) if training else None
        facts["training_kept"] = sum(kept) / len(kept) if training and len(kept) == len(training) else None
        return facts

    def _skip_what_cannot_run_here(self, jobs: list[Workload]) -> None:
        device = self.session.device()
        if self.mode_class.alone and len(jobs) > 1 and len({job.key() for job in jobs}) == 1:
            pytest.skip(f"{self.mode}: the same job run again one after another is the job alone, measured once per "
                        "session; this scenario adds nothing to it")
        if device.gpu is None and any(job.cuda_graph for job in jobs):
            pytest.skip(f"{device.reason}: cuda_graph=True needs a CUDA GPU")
        if device.gpu is None and not self.node.get_closest_marker("gpucolloc_quick") \
                and not self.session.options.colloc_cpu_full:
            pytest.skip(f"{device.reason}: runs only the quick tier (marker 'gpucolloc_quick'); "
                        "pass --colloc-cpu-full to run every scenario on the CPU")

    def _skip_what_does_not_fit(self, jobs: list[Workload], alone: dict, context: ScenarioContext) -> None:
        """Jobs sharing the whole GPU whose memory alone adds up to more than it has cannot all start: skipped
        before any worker starts, saying what each used alone (as NVML saw it). A mode that plans memory itself (MIG's
        planner) decides for itself."""
        gpu = context.target.gpu
        if gpu is None or self.mode_class.plans_memory_itself or len(jobs) < 2:
            return
        adapted = self._adapted(jobs, context)
        used = [size for job in adapted if (run := alone.get(job.key())) and run.workers  # each job's memory alone
                and (size := run.workers[0].device_memory_bytes) is not None]
        if len(used) < len(adapted) or sum(used) <= gpu.memory_total_bytes:
            return  # unknown (no telemetry), or it fits: one that still runs out fails with the worker's error
        each: dict[str, list] = {}
        for job, size in zip(adapted, used):
            each.setdefault(job.label, [0, size])[0] += 1
        listed = ", ".join(f"{n}x {label} {size / 1e9:.1f} GB" for label, (n, size) in each.items())
        pytest.skip(f"{self.mode}: does not fit in the GPU's memory: the jobs used {sum(used) / 1e9:.1f} GB alone "
                    f"({listed}); the {gpu.name} has {gpu.memory_total_bytes / 1e9:.1f} GB")

    @contextlib.contextmanager
    def _outcome(self):
        """What can go wrong becomes the test's outcome: a skip (cannot run here) or a failure (with why)."""
        try:
            yield
        except ModeUnavailable as exc:  # e.g. a MIG layout that does not fit: the summary lists it with the skips
            pytest.skip(f"{self.mode}: {exc}")
        except ModeFailed as exc:  # a bad configuration, or a daemon or MIG layout that could not be set up
            raise pytest.fail.Exception(f"{self.mode}: {exc}", pytrace=False) from None
        except ScenarioFailed as exc:
            if exc.diagnostics:
                self.node.stash[diagnostics_key] = exc.diagnostics
            failure = pytest.fail.Exception(f"{self.mode}: {exc}", pytrace=False)
            if isinstance(exc.__cause__, WorkerFailed):  # its message holds the worker's error and output already
                raise failure from None
            raise failure from exc  # anything else keeps its traceback: a fault of the plugin's own is found from it

    def _run(self, jobs: list[Workload], context: ScenarioContext, mode_name: str | None = None) -> ScenarioResult:
        """The scenario, its workers started ``context.repeats`` times afresh (an A/B arm's: once per block)."""
        mode = MODES[mode_name or self.mode]()
        link = interleave.link([item.nodeid for item in self.node.session.items])
        if mode_name is not None:  # an arm of an A/B pairs its scenarios, not their references
            link = None
        test = self.node.nodeid
        runs: list[ScenarioResult] = []
        # fresh processes for each repeat, or for each block as long as the A/B wants more
        while (len(runs) < context.repeats) if link is None else (not runs or link.more.get(test)):
            # a new fork server from the second repeat (or A/B block) on: workers forked from one appear to share a
            # level (a host-bound service's latency), which repeats from one server would not sample (docs/ab.md)
            if runs:
                close_shared()
            runs.append(run_scenario(jobs, mode, context.target, context.settings, self.log_dir / mode.name /
                                     f"r{len(runs)}", None if link else context.sampler_factory,
                                     Pairing(link, test, len(runs)) if link else None))
        return combine_repeats(runs)

    def _one_job_key(self, jobs: list[Workload], context: ScenarioContext) -> tuple:
        return self._adapted(jobs, context)[0].key(), self.session.device().key

    def _measured_before(self, jobs: list[Workload], context: ScenarioContext) -> ScenarioResult | None:
        """A one-job scenario that is by construction a measurement taken earlier in this session under another mode
        (``SharingMode.same_with_one_job``): that measurement, recorded under this mode and saying so."""
        same_as = self.mode_class.same_with_one_job
        if len(jobs) != 1 or same_as is None or jobs[0].sm_percent is not None or jobs[0].memory_limit_mb is not None:
            return None
        key = self._one_job_key(jobs, context)
        baselines = self.session.baselines
        earlier = baselines.alone.get(key) if same_as == "alone" else baselines.one_job.get((same_as, *key))
        if earlier is None or max(len(earlier.repeats), 1) != context.repeats:  # a test's repeats marker differs
            return None
        return taken_once(earlier, same_as, self.mode)

    @staticmethod
    def _adapted(jobs: list[Workload], context: ScenarioContext) -> list[Workload]:
        return [context.settings.adapt(job) for job in jobs]  # what the workers will run (CPU smoke: smaller)

    def _alone(self, jobs: list[Workload], context: ScenarioContext, always: bool = False
               ) -> dict[tuple, ScenarioResult]:
        """Each distinct job's measurement alone on this GPU, taken once per session by the first scenario that needs
        it. ``always``: even with --colloc-alone=off (a serving job's capacity, which its rate depends on)."""
        cache, device = self.session.baselines.alone, self.session.device().key
        if not self.session.options.colloc_alone and not self.mode_class.alone and not always:
            return {}  # --colloc-alone=off: no speedups
        reason = SequentialMode().unavailable_reason(context.target)
        if reason:  # e.g. a GPU in MIG mode: no whole GPU to run a job alone on; speedups stay unknown
            if self.mode_class.alone:
                pytest.skip(f"{self.mode}: {reason}")
            return {}
        missing = list({job.key(): job for job in self._adapted(jobs, context)
                        if (job.key(), device) not in cache}.values())
        for job in missing:
            cache[(job.key(), device)] = self._run([job], context, SequentialMode.name)
            self.session.alone_measured.append((self.node.name, cache[(job.key(), device)]))
        return {job.key(): cache[(job.key(), device)] for job in self._adapted(jobs, context)}

    def _add_baselines(self, result: ScenarioResult, context: ScenarioContext, want_ideal: bool) -> None:
        """Speedup against each job alone (measured once per session), and the 'ideal' reference (one process
        with the summed batch) when asked for."""
        baselines, device = self.session.baselines, self.session.device().key
        # each job's throughput over its whole window, alone and here: the same statistic on both sides, so that
        # a record of the alone measurement itself has a speedup of exactly 1
        alone_runs = [baselines.alone.get((w.workload.key(), device)) for w in result.workers]
        result.alone_throughputs = alone = [run.workers[0].stats.throughput if run else None for run in alone_runs]
        if MODES[result.mode].alone:
            result.speedup = 1.0
        else:  # of the training jobs: a serving job beside them is judged by its latency (result.serving)
            training = {id(w) for w in counted(result.workers)}
            pairs = [(w.stats.throughput, a) for w, a in zip(result.workers, alone) if id(w) in training]
            result.speedup = measure.weighted_speedup([c for c, _ in pairs], [a for _, a in pairs])
        if want_ideal and result.homogeneous:
            combined = result.workloads[0].with_batch_size(sum(w.batch_size for w in result.workloads))
            key = (combined.key(), device)
            if key not in baselines.ideal:
                ideal = run_scenario([combined], SequentialMode(), context.target, context.settings, self.log_dir)
                baselines.ideal[key] = ideal.aggregate_throughput
            result.ideal_throughput = baselines.ideal[key]

    def _judge(self, result: ScenarioResult, context: ScenarioContext, jobs: list[Workload] | None,
               ideal: bool) -> tuple[ScenarioResult, gate.Verdict]:
        """The gate's verdict, a serving job's latency beside the throughput. A run that looks disturbed is measured
        again first, --colloc-gate-remeasure times at most, when this scenario measured it (``jobs``)."""
        loaded = self.session.history
        assert loaded is not None  # the session loads it before the first gated scenario
        last = history.GATE_WINDOW * context.policy.runs
        saved = loaded.samples(self.node.nodeid, last=last)
        references = [(sample, loaded.samples(nodeid, last=last)) for nodeid, sample in self.session.judged]
        remeasured: list[str] = []
        while True:
            judged = record.read(record.write(result))  # judged as it will be saved
            current = sample_of(judged, "current")
            verdict = gate.decide(current, saved, context.policy, references)
            for metric in history.LATENCY:
                latency = latency_sample_of(judged, "current", metric=metric)
                if latency is not None:
                    saved_latency = loaded.samples(self.node.nodeid, metric=metric, last=last)
                    with_latency(verdict, gate.decide(latency, saved_latency, context.policy))
            disturbed = verdict.disturbed or next(  # the alone measurement is the session's: measured again it is not
                (f"{metric}: {v.disturbed}" for metric, v in verdict.latency.items()
                 if v.disturbed and not metric.startswith("alone")), None)
            if not disturbed or jobs is None or len(remeasured) >= self.session.options.colloc_gate_remeasure:
                break
            remeasured.append(disturbed)
            result = self._run(jobs, context)
            self._add_baselines(result, context, ideal)
            result.serving = self._serving(result, context)
        if remeasured:
            verdict.remeasured = remeasured
            verdict.notes.insert(0, f"measured {len(remeasured) + 1} times, judged on the last: the earlier run(s) "
                                    f"looked disturbed ({'; '.join(remeasured)})")
        self.session.judged.append((self.node.nodeid, current))
        self.session.verdicts.append((self.node.name, verdict))
        return result, verdict

    def _record(self, result: ScenarioResult, verdict: gate.Verdict | None) -> None:
        """Into pytest-benchmark: timing = seconds per sample of aggregate throughput per round (so
        --benchmark-compare-fail sees a throughput loss), the record in extra_info. An xdist worker's
        pytest-benchmark is off: the controller records it (distributed.py)."""
        result.warnings = run_warnings.of(result, verdict)
        progress.warn(result.warnings)  # said as soon as known, and in the summary and the record
        benchmark = self.benchmark
        benchmark.extra_info.update(record.write(result, verdict))
        if markers.left_to_ab(self.node):  # saved saying so, gated or not: no gate judges it against history
            benchmark.extra_info["gate_by"] = "ab"
            if self.session.history is not None:
                self.session.measured_for_ab.append(self.node.nodeid)
        seconds = measure.seconds_per_sample(result.aggregate_rounds)
        if not benchmark.disabled:
            benchmark_api.record_rounds(benchmark, seconds)
        elif self.session.xdist_index is not None:
            self.session.forward.append(distributed.forwarded_entry(benchmark, seconds))
            benchmark_api.mark_used(benchmark, "recorded by the xdist controller")
        self.session.results.append((self.node.name, result, verdict))
