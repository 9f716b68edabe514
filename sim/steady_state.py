"""Steady state of one replication: the warm-up to leave out (MSER-5), batch means, and whether the queue grows.

Warm-up rule (MSER-5, White 1997): average the per-request series (queueing delay, by arrival order) in batches of
5; delete the first d batches, d chosen from the first half to minimise the squared standard error of the rest's
mean, sum((Y_i - mean)^2) / (b - d)^2. A run whose best cut is in the first half is left out up to it.

Queue trend: the measured requests (after the cut) in ``BATCHES`` batch means by arrival order; the least-squares
slope of batch-mean queueing delay against batch-mean arrival time (seconds of wait gained per second of run).
A stable queue has slope 0; a queue fed faster than it is served gains about (offered / served - 1) s per s.

Run length: batch means of a run long enough to judge are nearly independent; a lag-1 autocorrelation of the
batch means of the decision metric (each request meeting the SLA or not) well above zero says the batches are
shorter than the queue's memory, and so the run too short (its start, from an empty system, still weighs).
"""

from __future__ import annotations

import numpy as np

MSER_BATCH = 5
BATCHES = 10


def mser5_cut(values) -> int:
    """How many leading observations of ``values`` MSER-5 leaves out (a multiple of 5, at most half of them)."""
    y = np.asarray(values, dtype=float)
    b = y.size // MSER_BATCH
    if b < 4:
        return 0
    means = y[:b * MSER_BATCH].reshape(b, MSER_BATCH).mean(axis=1)
    # tail sums of the batch means and of their squares: the error of deleting d batches in O(b)
    tail = np.cumsum(means[::-1])[::-1]
    tail_sq = np.cumsum((means * means)[::-1])[::-1]
    d = np.arange(b // 2 + 1)
    count = b - d
    sse = tail_sq[d] - tail[d] ** 2 / count
    return int(np.argmin(sse / count**2)) * MSER_BATCH


def batch_means(values, batches: int = BATCHES) -> np.ndarray:
    """Means of ``batches`` consecutive, (nearly) equal parts of ``values``."""
    y = np.asarray(values, dtype=float)
    if y.size < batches:
        raise ValueError(f"{y.size} values cannot make {batches} batch means")
    return np.array([part.mean() for part in np.array_split(y, batches)])


def lag1_correlation(values) -> float:
    """Lag-1 autocorrelation of a short series (batch means); 0 when it does not vary."""
    x = np.asarray(values, dtype=float) - np.mean(values)
    total = float(np.dot(x, x))
    return float(np.dot(x[:-1], x[1:]) / total) if total > 0 else 0.0


def queue_trend(arrivals, delays, batches: int = BATCHES) -> float:
    """Slope (s of queueing delay per s of run) of the batch means of ``delays`` against those of ``arrivals``."""
    t, q = batch_means(arrivals, batches), batch_means(delays, batches)
    return float(np.polyfit(t - t.mean(), q, 1)[0])


def steady_window(columns) -> np.ndarray:
    """The mask of a result's ``columns`` (``SimResult.columns``) a steady-state statistic uses: its measured
    requests less the MSER-5 warm-up of their queueing delay (by arrival order)."""
    measured = np.asarray(columns["measured"], dtype=bool)
    order = np.flatnonzero(measured)
    order = order[np.argsort(columns["arrival"][order], kind="stable")]
    delay = np.nan_to_num(columns["queue_delay"][order], nan=0.0)
    keep = np.zeros_like(measured)
    keep[order[mser5_cut(delay):]] = True
    return keep
