"""A serving job's requests and their latencies (``Workload(..., rate=...)``); how it measures: docs/serving.md.

Worker side (``Requests``, ``serve_rounds``): open loop, requests arrive on a fixed (or seeded Poisson) schedule and
each latency counts from the request's *scheduled* arrival to its answer (no coordinated omission), into one HDR
histogram per round; requests still queued at the end count at the wait they had so far. Controller side
(``summary``): the job's percentiles, achieved rate, queue, and whether it was ``saturated``.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from hdrh.histogram import HdrHistogram

LOWEST_US, HIGHEST_US, DIGITS = 1, 3_600_000_000, 3
MAX_ENCODED = 1 << 16  # one round's encoded histogram, at most (a few hundred bytes in practice)
# A service waits for its next arrival asleep but for the last SPIN_S (sleep wakes late). Measured, a service on cores
# of its own spins the whole wait: on an H200's host a core woken from sleep dispatched an eager service's kernels
# slower, by varying amounts (a decoder's rounds' p50 spread 11% asleep, 2.8% spinning: docs/serving.md).
SPIN_S = 0.001
# Saturated: at the end of the measurement more requests wait than arrive in this long (and at least a few): the
# queue grew instead of draining, and the percentiles describe how long the run lasted, not the job.
SATURATED_BACKLOG_S, SATURATED_MIN_REQUESTS = 0.25, 5
QUEUED_SAMPLES = 10_000  # requests still queued at the end are recorded in at most about this many groups
JUDGED = (50, 90, 99, 99.9)  # a service's latency percentiles judged (p50 always; a tail where requests resolve it)
TAIL_REQUESTS = 2  # a percentile is resolved by a sample holding at least this many requests beyond it
ROUND_PERCENTILES = (50, 90, 99)  # each round's, in the record: a run's own spread of each
MIN_REQUESTS_PER_ROUND = 2  # a slower rate leaves rounds without a request: no latency, no throughput to judge


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)


def record(histogram: HdrHistogram, seconds: float, count: int = 1) -> None:
    histogram.record_value(min(max(round(seconds * 1e6), LOWEST_US), HIGHEST_US), count)


def queue_grew(backlog: int, offered_rps: float | None) -> bool:
    """More requests wait than arrive in SATURATED_BACKLOG_S (and more than a few): the queue grew instead of
    draining (open loop only: back to back nobody waits)."""
    return bool(offered_rps) and backlog > max(SATURATED_MIN_REQUESTS, SATURATED_BACKLOG_S * (offered_rps or 0.0))


class Requests:
    """The request schedule of one serving job; ``serve_one`` answers the next request and returns its latency."""

    SPIN_S = SPIN_S

    def __init__(self, step: Callable[[], None], sync: Callable[[], None], rate: float | None,
                 clock: Callable[[], float] = time.monotonic, spin: bool = False, arrivals: str = "even"):
        self.step, self.sync, self.clock = step, sync, clock
        self.spin = spin  # measured waits spin (a service pinned to cores of its own)
        self.rate, self.interval = rate or 0.0, 1.0 / rate if rate else None  # None: back to back
        self.poisson = arrivals == "poisson" and self.interval is not None
        self.restart(clock())

    def restart(self, start: float) -> None:
        """A new schedule from ``start``: the first request arrives then, with nobody queued before it."""
        self.start, self.answered = start, 0
        self.gaps = random.Random(0)  # Poisson gaps: the same sequence from every start, so runs compare alike
        self.offsets = [0.0]  # Poisson: each request's arrival after ``start``, drawn as far as needed

    def arrival(self, k: int) -> float:
        """When request ``k`` (from 0) of this schedule arrives."""
        if not self.poisson:
            return self.start + k * self.interval if self.interval else self.clock()
        while len(self.offsets) <= k:
            self.offsets.append(self.offsets[-1] + self.gaps.expovariate(self.rate))
        return self.start + self.offsets[k]

    def next_arrival(self) -> float:
        return self.arrival(self.answered)

    def backlog(self, now: float) -> int:
        """Requests that have arrived by ``now`` and not been answered (0 back to back)."""
        if not self.interval or now < self.start:
            return 0
        if not self.poisson:
            return max(math.floor((now - self.start) / self.interval) + 1 - self.answered, 0)
        k = self.answered
        while self.arrival(k) <= now:
            k += 1
        return k - self.answered

    def wait_until(self, instant: float, spin: bool = False) -> None:
        """Until ``instant``: spinning all the way when ``spin``, else asleep but for SPIN_S."""
        while (left := instant - self.clock()) > 0:
            if left > SPIN_S and not spin:
                time.sleep(left - SPIN_S)

    def serve_one(self, spin: bool = False) -> float:
        arrival = self.next_arrival()
        self.wait_until(arrival, spin)
        self.step()
        self.sync()  # answered: the result is on the host's side of the device
        self.answered += 1
        return self.clock() - arrival


def serve_rounds(requests: Requests, start: float, round_s: float, rounds: int, samples_per_request: int,
                 fresh: bool = True) -> tuple[list[tuple[float, int]], list[dict[str, Any]]]:
    """Serve through ``rounds`` rounds from ``start``, sharing the training workers' boundaries: per round (seconds,
    samples answered), and its latencies (an encoded histogram) and queue at its end. ``fresh``: the first batch of
    a measurement, on a new schedule from ``start`` with nobody queued; else more rounds of the same measurement,
    whose schedule and queue go on (a service that falls behind is seen to, however the rounds are batched)."""
    if fresh:
        requests.restart(requests.clock())  # at its rate until the start, even after a pause (Idle)
    while requests.next_arrival() < start and requests.clock() < start:  # unmeasured load until the start
        requests.serve_one(requests.spin)  # (a job that has fallen behind its schedule stops at the start all the same)
    requests.wait_until(start, requests.spin)
    if fresh:
        requests.restart(start)
    measured: list[tuple[float, int]] = []
    latencies: list[dict[str, Any]] = []
    histogram, answered, last = new_histogram(), 0, start
    boundary = start + round_s
    while len(measured) < rounds:
        if requests.next_arrival() < boundary:
            record(histogram, requests.serve_one(requests.spin))
            answered += 1
        else:
            requests.wait_until(boundary, requests.spin)  # nobody waits: the round ends idle
        now = requests.clock()
        if now >= boundary:
            backlog = requests.backlog(now)
            if len(measured) == rounds - 1:  # still queued at the end: counted at their wait so far
                step = max(backlog // QUEUED_SAMPLES, 1)  # a long queue in groups of equal waits (same percentiles)
                for k in range(requests.answered, requests.answered + backlog, step):
                    record(histogram, now - requests.arrival(k), min(step, requests.answered + backlog - k))
            measured.append((now - last, answered * samples_per_request))
            latencies.append({"histogram": histogram.encode().decode("ascii"), "backlog": backlog})
            histogram, answered, last = new_histogram(), 0, now
            while boundary <= now:
                boundary += round_s
    return measured, latencies


def resolves(requests: int, percentile: float) -> bool:
    """Whether ``requests`` hold at least TAIL_REQUESTS beyond ``percentile`` (p99: 200; p99.9: 2,000)."""
    return requests * (1 - percentile / 100) >= TAIL_REQUESTS - 1e-9


def name(percentile: float) -> str:
    """``p50``, ``p99``, ``p99.9``."""
    return f"p{percentile:g}"


def decode(encoded: str) -> HdrHistogram:
    return HdrHistogram.decode(encoded.encode("ascii"))


def merged(windows: list[dict]) -> HdrHistogram:
    """Windows' encoded histograms (``histogram``), every request in one histogram."""
    histogram = new_histogram()
    for window in windows:
        histogram.add(decode(window["histogram"]))
    return histogram


def check_round(entry: Any) -> str | None:
    """What is wrong with one round's latency entry from a worker, or None."""
    if not isinstance(entry, dict) or set(entry) != {"histogram", "backlog"}:
        return f"a round's latencies must be {{histogram, backlog}}, got {str(entry)[:80]}"
    encoded, backlog = entry["histogram"], entry["backlog"]
    if not isinstance(encoded, str) or len(encoded) > MAX_ENCODED:
        return "a round's latency histogram must be encoded text of at most 64 KiB"
    if isinstance(backlog, bool) or not isinstance(backlog, int) or backlog < 0:
        return f"a round's backlog must be a whole number of requests, got {str(backlog)[:40]}"
    try:
        decode(encoded)
    except Exception as error:  # whatever the codec raises on bad input
        return f"a round's latency histogram does not decode ({type(error).__name__})"
    return None


def _ms(histogram: HdrHistogram, percentile: float) -> float | None:
    return histogram.get_value_at_percentile(percentile) / 1000 if histogram.get_total_count() else None


def summary(rate: float | str, offered_rps: float | None, rounds: Sequence[tuple[float, int]],
            latencies: Sequence[dict[str, Any]], samples_per_request: int) -> dict[str, Any]:
    """The serving job's numbers for the record: percentiles over every request of the measurement, each round's
    p99 (the run's own spread), rates, queue, and ``saturated`` with why."""
    merged = new_histogram()
    by_round: dict[int, list[float | None]] = {q: [] for q in ROUND_PERCENTILES}
    for entry in latencies:
        histogram = decode(entry["histogram"])
        merged.add(histogram)
        for q, values in by_round.items():
            values.append(_ms(histogram, q))
    seconds = sum(s for s, _ in rounds)
    answered = sum(samples for _, samples in rounds) / samples_per_request
    achieved = answered / seconds if seconds > 0 else 0.0
    unserved = latencies[-1]["backlog"] if latencies else 0
    facts: dict[str, Any] = {
        "rate": rate, "offered_rps": offered_rps, "achieved_rps": achieved, "requests": merged.get_total_count(),
        "p50_ms": _ms(merged, 50), "p90_ms": _ms(merged, 90), "p99_ms": _ms(merged, 99),
        "p999_ms": _ms(merged, 99.9), "max_ms": merged.get_max_value() / 1000 if merged.get_total_count() else None,
        **{f"round_p{q}_ms": values for q, values in by_round.items()},
        "backlog": [entry["backlog"] for entry in latencies], "unserved": unserved,
        "saturated": False, "histogram": merged.encode().decode("ascii") if merged.get_total_count() else None,
    }
    if offered_rps and queue_grew(unserved, offered_rps):
        facts["saturated"] = True
        facts["why"] = (f"{offered_rps:,.0f} requests/s is more than it serves: the queue grew to {unserved:,} "
                        f"requests ({unserved / offered_rps:.1f} s of arrivals) by the end, while it answered "
                        f"{achieved:,.0f}/s; its latency percentiles measure the queue, not the job")
    return facts
