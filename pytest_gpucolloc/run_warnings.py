"""Warnings on a measured scenario, as pyperf gives them: what makes its numbers doubtful, said while it runs, in
the summary and in its record (``warnings``). Each is one sentence: what was seen, why it matters, what to do."""
from __future__ import annotations

import os

from .verdict import Verdict

UNSTABLE_CV = 0.10  # round-to-round spread of aggregate throughput above which the rounds are unstable
SPEEDUP_SLACK = 1.05  # a job may run a little faster beside others than alone (noise); n jobs cannot make 1.05 n


def usable_cores() -> int:  # where the tests say how many the run may use
    return len(os.sched_getaffinity(0))


def of(result, verdict: Verdict | None = None, cores: int | None = None, parallel: int | None = None) -> list[str]:
    """The warnings on ``result`` (a ``scenario.ScenarioResult``) and its gate ``verdict``; ``cores``: CPU cores
    this run may use; ``parallel``: xdist workers running scenarios at once."""
    cores = usable_cores() if cores is None else cores
    parallel = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if parallel is None else parallel
    found = []
    if result.cv is not None and result.cv > UNSTABLE_CV:
        found.append(f"unstable rounds: aggregate throughput varied {result.cv:.0%} (CV) from round to round, above "
                     f"{UNSTABLE_CV:.0%}; something else was using the machine, or the rounds are too short: see "
                     "`pytest-gpucolloc check`, or raise --colloc-round-seconds")
    at_once = 1 if result.mode == "sequential" else len(result.workers)  # sequential: one job at a time
    if at_once * parallel > cores:
        who = f"{at_once} workers" + (f" in each of {parallel} xdist workers" if parallel > 1 else "")
        found.append(f"more workers than CPU cores: {who} on {cores} cores; they wait for a core, so the numbers "
                     "measure the CPU rather than the sharing mode (fewer jobs, or a machine with more cores)")
    jobs = len(result.workers)
    # on the CPU the jobs alone and together share its cores with whatever else runs: no GPU's speedup to check
    if result.speedup is not None and result.speedup > SPEEDUP_SLACK * jobs and result.device != "cpu":
        found.append(f"impossible speedup: {result.speedup:.2f}x from {jobs} job{'s' if jobs > 1 else ''} (at most "
                     f"{jobs}x); the jobs alone were measured under other load (xdist, another benchmark) or the "
                     "machine changed between the measurements")
    if parallel > 1 and result.device == "cpu":
        found.append(f"{parallel} xdist workers measure at once on this machine's CPU: each disturbs the others' "
                     "numbers, the jobs alone included; run without -n (or with one GPU per xdist worker)")
    serving = getattr(result, "serving", None) or {}
    if serving.get("saturated"):
        found.append(f"saturated service: {serving.get('why')}; lower its rate (e.g. rate=\"80%\" of what it "
                     "answers back to back alone)")
    lever = ((verdict.noise if verdict else None) or {}).get("lever") or ""
    if "not by repeats" in lever:
        found.append(f"the gate cannot resolve its threshold here: {lever}")
    return found
