"""Per-request sufficient statistics of token times, computed in vectorized batches, and a streaming
histogram of every inter-token gap.

A live request keeps its token times (``Request.token_times``) only until it finishes; then they are folded
into two numbers and the histogram, so memory is bounded by the requests in flight, not by all tokens:

- ``max_ewm_gap``: the maximum over the request of ``pandas.Series(gaps).ewm(span=16).mean()`` (adjust=True).
  FastGen's generation SLA at rate r holds iff ``max_ewm_gap < 1 / r``.
- ``max_mean_gap``: max over k >= 1 of ``(t_k - t_0) / k``. FastGen's cumulative SLA (token k by k / r after
  the first) holds iff ``max_mean_gap <= 1 / r``.

Gap percentiles come from a log-spaced histogram (``BINS_PER_DECADE`` bins per decade, so a reported
percentile is within about 1.2% of the exact one); the mean gap is exact.
"""

from __future__ import annotations

from array import array
from itertools import chain

import numpy as np

EWM_SPAN = 16
BINS_PER_DECADE = 100
LOG_MIN, LOG_MAX = -7, 4  # gaps from 0.1 us to 10,000 s; outside values go to the end bins


class GapHistogram:
    """Counts of inter-token gaps in log-spaced bins, with the exact count and sum."""

    def __init__(self) -> None:
        self.edges = np.logspace(LOG_MIN, LOG_MAX, (LOG_MAX - LOG_MIN) * BINS_PER_DECADE + 1)
        self.counts = np.zeros(len(self.edges) + 1, dtype=np.int64)  # [underflow, bins..., overflow]
        self.total = 0.0

    def add(self, gaps: np.ndarray) -> None:
        if gaps.size:
            self.counts += np.bincount(np.searchsorted(self.edges, gaps, side="right"),
                                       minlength=len(self.counts))
            self.total += float(gaps.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def mean(self) -> float:
        n = self.count
        return self.total / n if n else float("nan")

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), as the geometric middle of its bin."""
        n = self.count
        if not n:
            return float("nan")
        i = int(np.searchsorted(np.cumsum(self.counts), q / 100 * n, side="left"))
        e = self.edges
        if i == 0:
            return float(e[0])
        if i >= len(e):
            return float(e[-1])
        return float(np.sqrt(e[i - 1] * e[i]))

    def merge(self, other: GapHistogram) -> None:
        self.counts += other.counts
        self.total += other.total


def gap_stats(token_times: list[list[float]], span: int = EWM_SPAN) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each request's token times: (max EWM gap, max mean gap since the first token, all gaps flat).

    Requests with a single token get 0 for both statistics (FastGen counts them as meeting the generation SLA).
    """
    n = len(token_times)
    lengths = np.fromiter(map(len, token_times), dtype=np.int64, count=n)
    if all(type(t) is array for t in token_times):  # the simulator's array("d") per request: one copy
        flat = np.frombuffer(b"".join(token_times), dtype=np.float64) if n else np.empty(0)
    else:
        flat = np.fromiter(chain.from_iterable(token_times), dtype=float, count=int(lengths.sum()))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    num_gaps = lengths - 1
    has = num_gaps > 0
    max_ewm = np.zeros(n)
    max_mean = np.zeros(n)
    if not has.any():
        return max_ewm, max_mean, np.empty(0)
    gaps_all = np.diff(flat)
    keep = np.ones(len(gaps_all), dtype=bool)
    keep[starts[1:] - 1] = False  # the diffs across request boundaries
    gaps = gaps_all[keep]
    gstarts = np.concatenate(([0], np.cumsum(num_gaps)[:-1]))
    seg = np.repeat(np.arange(n), num_gaps)
    k = np.arange(len(gaps)) - gstarts[seg]  # index of the gap within its request

    # EWM with pandas' adjust=True weights: y_k = x_k + beta * y_{k-1}, ewm_k = y_k / sum_{j<=k} beta^j. Requests
    # are sorted by length so that column k touches only the requests that have a gap k.
    beta = 1.0 - 2.0 / (span + 1)
    order = np.argsort(-num_gaps, kind="stable")
    sorted_gaps = num_gaps[order]
    sorted_starts = gstarts[order]
    neg_sorted = -sorted_gaps
    y = np.zeros(n)
    best = np.zeros(n)
    weight = 0.0
    for col in range(int(sorted_gaps[0])):
        m = int(np.searchsorted(neg_sorted, -col, side="left"))  # requests with more than col gaps
        weight = weight * beta + 1.0
        ym = y[:m]
        ym *= beta
        ym += gaps[sorted_starts[:m] + col]
        np.maximum(best[:m], ym / weight, out=best[:m])
    max_ewm[order] = best
    first = gstarts[has]
    since_first = flat[np.repeat(starts, num_gaps) + k + 1] - flat[np.repeat(starts, num_gaps)]
    max_mean[has] = np.maximum.reduceat(since_first / (k + 1), first)
    return max_ewm, max_mean, gaps
