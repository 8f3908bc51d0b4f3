"""How should these jobs share this GPU? Ranks the ways saved scenarios measured a job mix to run, and never
presents a prediction (predict.py) as a measurement; with a p99 budget (``serving_advice``), the way that keeps a
service within it while training keeps the most. What it answers and how: docs/advisor.md, docs/serving.md.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shlex
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from . import predict
from .history import SavedRun, short_name
from .mig.planner import why_it_cannot_exist
from .modes import MODES
from .modes.mig import MigMode
from .record import ScenarioRecord, service_as_asked, sm_reserved
from .words import count
from .workloads import ALIASES, Workload, WorkloadError

MIN_FAIR_SHARE = 0.5  # below this a job runs at less than half its alone speed: said as a warning
SHARING = [name for name, mode in MODES.items() if not mode.alone]  # the ways jobs share the GPU, to measure


class AdviceError(ValueError):
    pass


def parse_jobs(text: str) -> Counter:
    """'resnet26-cifar10/bs128*3,resnet50*2' -> Counter of workload labels. A job is a label as the summary shows
    it, or a name as ``Workload`` takes it (an alias, at its default batch size)."""
    jobs: Counter = Counter()
    for part in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"([\w.:-]+)((?:/[\w-]+)*)(?:\*(\d+))?", part)
        if not match or (match.group(2) and not re.match(r"/bs\d+", match.group(2))):
            raise AdviceError(f"--jobs: {part!r} is not LABEL[*COUNT], e.g. resnet26-cifar10/bs128*3 or resnet26*3 "
                              "(labels as the summary table shows them, or workload names)")
        name, rest = match.group(1), match.group(2)
        if rest:
            label = ALIASES.get(name, name) + rest
        else:
            try:
                label = Workload(name).label
            except WorkloadError as error:
                raise AdviceError(f"--jobs: {error}") from None
        jobs[label] += int(match.group(3) or 1)
    return jobs


@dataclass
class Option:
    scenario: str
    run_id: str
    mode: str
    graphed: bool
    speedup: float | None  # sum over jobs of throughput / the job alone as asked for (eager)
    worst_share: float | None  # the slowest job's throughput / its alone throughput
    samples_per_joule: float | None
    memory_headroom_gb: float | None
    mig_layout: str | None = None
    mig_cannot_exist: str | None = None  # why this mix's MIG layout (its jobs' mig sizes) cannot exist on the GPU

    @property
    def way(self) -> str:
        text = self.mode + (f" ({self.mig_layout})" if self.mig_layout else "")
        return text + (", CUDA graphs" if self.graphed else "")


EXECUTION_VARIANTS = ("graph", "cudnn-heuristics")  # how a job runs, not what it trains


def _graph_free(label: str) -> str:
    """The label of the same job run eagerly with cuDNN's defaults (``.../bs128/graph/cudnn-heuristics/loader4`` ->
    ``.../bs128/loader4``): a graphed variant is a way to run that job."""
    return "/".join(part for part in label.split("/") if part not in EXECUTION_VARIANTS)


def alone_references(runs: list[SavedRun]) -> dict[str, float]:
    """Each job's throughput alone, by label, as the runs measured it (the reference of every speedup)."""
    found: dict[str, float] = {}
    for run in runs:
        for scenario in run.scenarios.values():
            for index, worker in enumerate(scenario.workers):
                if alone := scenario.alone_of(index):
                    found.setdefault(worker.workload, alone)
    return found


def option_of(name: str, run: SavedRun, scenario: ScenarioRecord, alone: dict[str, float]) -> Option:
    """One measured way. Its progress is counted against the jobs as asked for, alone: a graphed variant's
    throughput is divided by the eager job's alone throughput, so that graphs and sharing are compared fairly."""
    references = [alone.get(_graph_free(w.workload)) for w in scenario.workers]
    shares = [w.throughput / a for w, a in zip(scenario.workers, references) if a]
    complete = len(shares) == scenario.n_workers
    total = run.machine.get("gpu_memory_total_bytes")
    used = [w.device_memory_bytes for w in scenario.workers if w.device_memory_bytes]
    headroom = (total - sum(used)) / 1e9 if total and len(used) == len(scenario.workers) else None
    instances = scenario.mode_facts.get("mig_layout")  # recorded by the mig mode only
    layout = ",".join(str(i.get("profile")) for i in instances) if isinstance(instances, list) else None
    graphed = all("graph" in w.workload.split("/")[1:] for w in scenario.workers)
    return Option(short_name(name), run.run_id, scenario.mode, graphed, sum(shares) if complete else None,
                  min(shares) if complete else None, scenario.samples_per_joule, headroom, layout,
                  scenario.mig_cannot_exist)


def options_for(jobs: Counter, runs: list[SavedRun]) -> tuple[list[Option], bool]:
    """The measured ways to run ``jobs`` (graphed variants of the same jobs included), and whether they are the
    exact mix; when it was never measured, the measured mixes closest to it (most jobs in common)."""
    wanted = Counter({_graph_free(label): n for label, n in jobs.items()})
    measured = [(name, run, scenario) for run in runs for name, scenario in run.scenarios.items()
                if scenario.device == "cuda"]
    alone = alone_references(runs)
    mixes = {id(s): Counter(_graph_free(w) for w in s.workloads) for _, _, s in measured}
    exact = [option_of(n, r, s, alone) for n, r, s in measured if mixes[id(s)] == wanted]
    if exact:
        return exact, True
    overlap = {key: sum((mix & wanted).values()) for key, mix in mixes.items()}
    best = max(overlap.values(), default=0)
    return [option_of(n, r, s, alone) for n, r, s in measured if best and overlap[id(s)] == best], False


def rank(options: list[Option]) -> list[Option]:
    """Most aggregate progress first; a way that starves a job (below MIN_FAIR_SHARE) after the fair ones."""
    return sorted(options, key=lambda o: (o.worst_share is not None and o.worst_share < MIN_FAIR_SHARE,
                                          -(o.speedup or 0.0), -(o.samples_per_joule or 0.0)))


def advise(jobs: Counter, runs: list[SavedRun]) -> dict:
    options, exact = options_for(jobs, runs)
    if not options:
        smoke = any(scenario.device == "cpu" for run in runs for scenario in run.scenarios.values())
        raise AdviceError("no measured GPU scenario runs any of these jobs"
                          + (" (these runs are CPU smoke runs: they check the suite, and advise ranks what a GPU "
                             "measured)" if smoke else "")
                          + "; measure them on a GPU first, e.g. a test with "
                          f"collocate([...]) of {', '.join(sorted(jobs))} and pytest --gpu-mode={','.join(SHARING)}")
    ranked = rank(options)
    best = ranked[0]
    words = [f"{'Recommended' if exact else 'Closest measured, not this mix'}: {best.way} "
             f"({best.scenario}, run {best.run_id})"]
    if best.speedup is not None:
        words.append(f"the jobs together make {best.speedup:.2f}x the progress of running them one after another "
                     "as asked (without graphs)")
    if best.worst_share is not None:
        words.append(f"the slowest job runs at {best.worst_share:.0%} of its speed alone as asked")
    if best.samples_per_joule:
        words.append(f"{best.samples_per_joule:.1f} samples per joule")
    if best.worst_share is not None and best.worst_share < MIN_FAIR_SHARE:
        words.append(f"but every measured way slows some job below {MIN_FAIR_SHARE:.0%} of its alone speed")
    missing = [mode for mode in MODES if mode not in {option.mode for option in options}]
    cannot_exist = next((o.mig_cannot_exist for o in options if o.mig_cannot_exist), None) if exact else None
    if cannot_exist and MigMode.name in missing:  # nothing to measure: say why instead
        missing.remove(MigMode.name)
        words.append(f"MIG is no way for this mix here: its layout {cannot_exist}")
    return {
        "jobs": dict(jobs), "exact": exact, "recommendation": "; ".join(words), "options": ranked,
        "not_measured": missing, "mig_cannot_exist": cannot_exist,
        "measure_with": (f"pytest <your scenario of these jobs> --gpu-mode={','.join(missing)}" if missing else None),
        "graphed_measured": any(option.graphed for option in options),
        **({} if exact else predicted(jobs, runs)),
    }


def _gpu_name(run: SavedRun, scenario: ScenarioRecord) -> str | None:
    return (scenario.gpu or {}).get("name") or run.machine.get("gpu_name")


def mix_command(jobs: Counter, profiles: dict[str, predict.Profile], modes: list[str]) -> str:
    """The command that measures this mix (benchmarks/test_mix.py), each job as its profile's parameters."""
    mix = []
    for label, n in sorted(jobs.items()):
        params = dict(profiles[label].params)
        default = Workload(params["model"]).to_dict()
        mix.append({k: v for k, v in params.items() if k == "model" or default.get(k) != v} | {"count": n})
    return (f"GPUCOLLOC_MIX={shlex.quote(json.dumps(mix, separators=(',', ':')))} pytest benchmarks/test_mix.py "
            f"--gpu-mode={','.join(modes)}")


def predicted(jobs: Counter, runs: list[SavedRun]) -> dict:
    """A mix nobody measured, predicted from its jobs' profiles by the model fitted on every measured mix of the same
    GPU model (predict.py); ``predicted``: [] when a job was never profiled alone (named in ``unprofiled``)."""
    names = Counter(_gpu_name(r, s) for r in runs for s in r.scenarios.values() if s.device == "cuda")
    gpu = names.most_common(1)[0][0] if names else None
    mine = [(r, s) for r in runs for s in r.scenarios.values() if s.device == "cuda" and _gpu_name(r, s) == gpu]
    profiles = predict.profiles_of(s for _, s in mine)
    unprofiled = sorted(label for label in jobs if label not in profiles)
    if unprofiled:
        return {"predicted": [], "unprofiled": unprofiled, "predicted_lines": [
            f"Not predicted: {', '.join(unprofiled)} never measured alone with telemetry in these runs"]}
    observations = predict.observations_of(s for _, s in mine)
    checks = predict.held_out(observations, profiles)
    memory = max((r.machine.get("gpu_memory_total_bytes") or 0 for r, _ in mine), default=0) or None
    found = predict.predict(jobs, profiles, observations, memory, checks)
    kind = found[0].kind if found else "-"
    errors = [abs(c.error) for c in checks if c.kind == kind]
    error = f"{statistics.median(errors):.0%}" if errors else "unknown"
    ranked = sorted((p for p in found if p.speedup is not None), key=lambda p: -(p.speedup or 0.0))
    lines = [f"Predicted, not measured ({kind} mix on {gpu}; model error on held-out mixes: {error}):" if ranked else
             f"Not predicted ({kind} mix on {gpu}; model error on held-out mixes: {error}): measure it"]
    for p in ranked:
        low, high = min(p.shares.values()), max(p.shares.values())
        each = (f"each job at about {low:.0%} of its speed alone" if high - low < 0.005 else
                f"its jobs at about {low:.0%}-{high:.0%} of their speed alone")
        lines.append(f"  {p.mode}: {p.speedup:.2f}x (about {p.low:.2f}-{p.high:.2f}x; held out: {p.held_out_error:.0%}"
                     f" off over {p.held_out_mixes} mixes), {each}; contended: {p.contended}")
    lines += [f"  {p.mode}: measure it ({p.why_not})" for p in found if p.speedup is None]
    tied = predict.within_error(found, checks)
    if len(tied) > 1:  # the model cannot rank them: say so rather than pick one
        missed = ", ".join(f"{p.mode} {e:.0%}" if e is not None else f"{p.mode} unknown" for p, e in tied[1:])
        lines.append(f"  best mode: {' and '.join(p.mode for p, _ in tied)} within the model's error (held-out error "
                     f"of the ratio to {tied[0][0].mode}: {missed}): measure it")
    elif tied and len(ranked) == len(found):  # a mode left to measure could still be the best one
        lines.append(f"  best mode: {tied[0][0].mode} (predicted ahead of the next by more than the model's error)")
    if any(p.fits_in_memory is False for p in found):
        lines.append("  memory: the jobs used more memory alone than the GPU has: they do not fit together")
    sizes = [profiles[label].params.get("mig") for label, n in sorted(jobs.items()) for _ in range(n)]
    no_layout = why_it_cannot_exist(gpu, sizes)
    mig_words = f"no layout: {no_layout}" if no_layout else "not predicted (no MIG mix measured): measure it"
    lines.append(f"  {MigMode.name}: {mig_words}" + ("" if all(sizes) else ", with a mig size per job"))
    alone = [name for name, mode in MODES.items() if mode.alone]  # the jobs' profiles, for the model's next fit
    modes = alone + [m for m in SHARING if m != MigMode.name or (all(sizes) and not no_layout)]
    command = mix_command(jobs, profiles, modes)
    lines.append(f"Measure it: {command}")
    return {"predicted": [dataclasses.asdict(p) for p in found], "unprofiled": [], "predicted_lines": lines,
            "model_error": error, "measure_mix_with": command, "best_within_error": [p.mode for p, _ in tied]}


@dataclass(frozen=True)
class Budget:
    """What a service's p99 must stay within: milliseconds, or a multiple of its p99 alone at the same rate."""
    value: float
    relative: bool

    def __str__(self) -> str:
        return f"{self.value:g}x its p99 alone" if self.relative else f"{self.value:g} ms"

    def holds(self, option: ServingOption) -> bool:
        """A saturated service never holds a budget: its p99 measures how long the run lasted."""
        measured = option.p99_vs_alone if self.relative else option.p99_ms
        return not option.saturated and measured is not None and measured <= self.value


def parse_budget(text: str) -> Budget:
    """'25' or '25ms': milliseconds; '2x': twice the service's p99 alone."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(ms|x)?\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise AdviceError(f"--p99-within: {text!r} is not a budget: milliseconds (25 or 25ms) or a multiple of the "
                          "service's p99 alone at the same rate (2x)")
    return Budget(float(match.group(1)), match.group(2) == "x")


@dataclass
class ServingOption:
    """One measured way to run a service beside training jobs: medians over the runs of its scenario."""
    service: str  # the serving job's label, its rate as asked (record.service_as_asked)
    training_jobs: int
    mode: str
    sm_reserved: float | None  # percent of the SMs the service was given (record.sm_reserved)
    scenario: str
    runs: int
    p99_ms: float | None
    p99_vs_alone: float | None
    training_kept: float | None  # the training jobs' mean share of their speed alone
    saturated: bool

    @property
    def way(self) -> str:
        return self.mode + (f", {self.sm_reserved:g}% of SMs reserved for the service" if self.sm_reserved else "")


# how to measure what ``serving_advice`` answers from, said where no run holds it
MEASURE_SERVICE = ("measure one first, e.g. `pytest benchmarks/test_serving.py --colloc-full "
                   "--gpu-mode=naive,mps,mps-partitioned` (docs/serving.md)")


def serving_options(runs: list[SavedRun]) -> tuple[list[ServingOption], str]:
    """Each scenario with a service and training jobs beside it, and the device they ran on: GPU runs where there
    are any, else CPU smoke runs (never the two together)."""
    found = [(name, s) for run in runs for name, s in run.scenarios.items()
             if s.serving and (s.serving.get("training_jobs") or 0) > 0]
    device = "cuda" if any(s.device == "cuda" for _, s in found) else "cpu"
    by_scenario: dict[str, list[ScenarioRecord]] = defaultdict(list)
    for name, scenario in found:
        if scenario.device == device:
            by_scenario[name].append(scenario)
    options = []
    for name, scenarios in by_scenario.items():
        facts = [s.serving or {} for s in scenarios]
        p99_ms, vs_alone, kept = (predict.median_of_known([f.get(key) for f in facts])
                                  for key in ("p99_ms", "p99_vs_alone", "training_kept"))
        options.append(ServingOption(
            service_as_asked(facts[0]), facts[0]["training_jobs"], scenarios[0].mode, sm_reserved(scenarios[0]),
            short_name(name), len(scenarios), p99_ms, vs_alone, kept,
            sum(bool(f.get("saturated")) for f in facts) * 2 > len(facts)))  # saturated in most of its runs
    return options, device


def _answer(budget: Budget, n: int, options: list[ServingOption]) -> tuple[ServingOption, str]:
    """The way that keeps the budget while training keeps the most, with its sentence; where none keeps it, the one
    with the smallest p99 (or, when every way saturated the service, the one whose training kept the most)."""
    held = [o for o in options if budget.holds(o)]
    jobs = count(n, "training job")
    if held:
        best = max(held, key=lambda o: (o.training_kept or 0.0, -(o.p99_ms or 0.0)))
        kept = "-" if best.training_kept is None else f"{best.training_kept:.0%}"
        return best, (f"{jobs}: {best.way} ({best.scenario}) keeps p99 at {_ms(best)}, and training keeps "
                      f"{kept} of its speed alone")
    closest = _smallest(options)
    if closest is None:
        return (max(options, key=lambda o: o.training_kept or 0.0),
                f"{jobs}: none within {budget}: every measured way saturated the service")
    return closest, f"{jobs}: none within {budget}; the smallest p99: {_ms(closest)} under {closest.way} " \
                    f"({closest.scenario})"


def _smallest(options: list[ServingOption]) -> ServingOption | None:
    unsaturated = [o for o in options if not o.saturated and o.p99_ms is not None]
    return min(unsaturated, key=lambda o: o.p99_ms or 0.0) if unsaturated else None


def _ms(option: ServingOption) -> str:
    versus = f" ({option.p99_vs_alone:.2f}x alone)" if option.p99_vs_alone is not None else ""
    return f"{option.p99_ms:,.1f} ms{versus}"


def serving_advice(runs: list[SavedRun], budget: Budget) -> dict:
    """Per service and number of training jobs: the best way within the budget, or that none is and the smallest p99
    there. ``advice``: the answer in lines; ``met``: False when some service has no measured way within it at all."""
    options, device = serving_options(runs)
    if not options:
        raise AdviceError(f"none of the runs read ({', '.join(run.run_id for run in runs)}) has a serving job "
                          "(Workload(..., rate=...)) beside training jobs, so there is no p99 to bound: "
                          f"{MEASURE_SERVICE}, or name a saved run that has one (none named, the storage's latest "
                          "is read)")
    answers: list[dict] = []
    lines, met = [], True
    for service in sorted({o.service for o in options}):
        mine = [o for o in options if o.service == service]
        found = []
        for n in sorted({o.training_jobs for o in mine}):
            option, sentence = _answer(budget, n, [o for o in mine if o.training_jobs == n])
            found.append({"service": service, "training_jobs": n, "within": budget.holds(option), "option": option,
                          "sentence": sentence})
        answers += found
        if any(a["within"] for a in found):
            lines.append(f"{service}, p99 within {budget}, where training keeps the most:")
            lines += [f"  {a['sentence']}" for a in found]
            continue
        met = False
        closest = _smallest(mine)
        lines.append(f"No measured way keeps {service}'s p99 within {budget} beside training; " + (
            f"the smallest p99 seen: {_ms(closest)} under {closest.way} ({closest.scenario}, "
            f"{count(closest.training_jobs, 'training job')})" if closest else "every measured way saturated it"))
    if device == "cpu":
        lines.append("(CPU smoke runs: they check the suite, not what a GPU does)")
    return {"budget": str(budget), "device": device, "met": met, "answers": answers, "advice": lines}
