"""Interleaved timing: every case runs once per round, in a shuffled order.

A noisy machine slows whole stretches of time, so rather than timing case A
for ten seconds and then case B, each round times one small batch of every
case. Differences are taken within a round (``case[r] - baseline[r]``) and
summarised by their median, which cancels most of the noise.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Case:
    key: str
    call: Callable[[], None]
    check: Callable[[], None] = lambda: None  # raises if the answers were wrong
    samples: list[float] = field(default_factory=list)  # microseconds per call, one per round


def run(cases: Sequence[Case], rounds: int, batch: int, seed: int = 7) -> None:
    """Warm every case up, then time ``rounds`` batches of ``batch`` calls each."""
    for case in cases:
        for _ in range(batch):
            case.call()
        case.check()
    rng = random.Random(seed)
    order = list(cases)
    perf = time.perf_counter_ns
    # One full collection before timing, not one per round: with a million keys in a
    # memory backend, a full collection walks the whole heap (about 0.3 s here) and
    # slows the next ~100 requests several-fold, which would be charged to one case.
    gc.collect()
    for _ in range(rounds):
        rng.shuffle(order)
        for case in order:
            call = case.call
            start = perf()
            for _ in range(batch):
                call()
            case.samples.append((perf() - start) / batch / 1000)
    for case in cases:
        case.check()


def median(case: Case) -> float:
    return statistics.median(case.samples)


def added(case: Case, baseline: Case) -> float:
    """Median over rounds of the per-request difference to the baseline."""
    return statistics.median(a - b for a, b in zip(case.samples, baseline.samples, strict=True))


def spread(case: Case, baseline: Case | None = None) -> tuple[float, float]:
    """Quartiles (25th, 75th percentile) of the per-round values or differences."""
    values = (
        case.samples
        if baseline is None
        else [a - b for a, b in zip(case.samples, baseline.samples, strict=True)]
    )
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]
