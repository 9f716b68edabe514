"""Per-request aggregates of finished requests, kept as compact columns (not Request objects)."""

from __future__ import annotations

from array import array

import numpy as np

from sim.token_stats import GapHistogram, gap_stats

BATCH = 4096  # finished requests whose token times are reduced together


class RequestLog:
    """Collects one row per finished request; ``measured(i)`` says whether request i counts in the statistics
    (warm-up and cool-down requests are kept as rows but left out of the gap histogram)."""

    FLOAT_COLUMNS = ("arrival", "scheduled", "first_token", "finish")
    INT_COLUMNS = ("id", "replica", "prompt_tokens", "output_tokens", "preemptions", "cached_tokens")

    def __init__(self, measured_from: int = 0, measured_to: int | None = None) -> None:
        self.columns = {c: array("d") for c in self.FLOAT_COLUMNS}
        self.columns.update({c: array("q") for c in self.INT_COLUMNS})
        self.max_ewm_gap = array("d")
        self.max_mean_gap = array("d")
        self.gaps = GapHistogram()
        self.measured_from = measured_from
        self.measured_to = measured_to
        self._pending: list[list[float]] = []
        self._pending_measured: list[bool] = []

    def __len__(self) -> int:
        return len(self.columns["id"])

    def record(self, request, replica: int) -> None:
        c = self.columns
        rid = request.request_id
        c["id"].append(rid)
        c["replica"].append(replica)
        c["arrival"].append(request.arrival_time)
        c["scheduled"].append(request.scheduled_time)
        c["first_token"].append(request.first_token_time)
        c["finish"].append(request.finish_time)
        c["prompt_tokens"].append(request.num_prompt_tokens)
        c["output_tokens"].append(request.num_output_tokens)
        c["preemptions"].append(request.num_preemptions)
        c["cached_tokens"].append(request.num_cached_tokens)
        times = request.token_times
        request.token_times = None
        self._pending.append(times if times is not None else [])
        self._pending_measured.append(self.measured_from <= rid and (self.measured_to is None
                                                                     or rid < self.measured_to))
        if len(self._pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        max_ewm, max_mean, _ = gap_stats(self._pending)
        self.max_ewm_gap.extend(max_ewm)
        self.max_mean_gap.extend(max_mean)
        measured = [t for t, m in zip(self._pending, self._pending_measured) if m and len(t) > 1]
        if measured:
            self.gaps.add(gap_stats(measured)[2])
        self._pending.clear()
        self._pending_measured.clear()

    def merge(self, other: RequestLog) -> None:
        """Append the rows and gap statistics of ``other`` (a log of other replicas of the same run)."""
        self.flush()
        other.flush()
        for name, column in self.columns.items():
            column.extend(other.columns[name])
        self.max_ewm_gap.extend(other.max_ewm_gap)
        self.max_mean_gap.extend(other.max_mean_gap)
        self.gaps.merge(other.gaps)

    def to_frame(self):
        """One row per request, sorted by id: the columns above plus ttft, tpot, e2e, queue_delay and the
        FastGen statistics ``max_ewm_gap`` and ``max_mean_gap``."""
        import pandas as pd

        self.flush()
        df = pd.DataFrame({name: np.frombuffer(col, dtype=np.float64 if col.typecode == "d" else np.int64)
                           for name, col in self.columns.items()})
        df["max_ewm_gap"] = np.frombuffer(self.max_ewm_gap, dtype=np.float64)
        df["max_mean_gap"] = np.frombuffer(self.max_mean_gap, dtype=np.float64)
        df = df.sort_values("id", kind="stable").reset_index(drop=True)
        df["queue_delay"] = df["scheduled"] - df["arrival"]
        df["ttft"] = df["first_token"] - df["arrival"]
        df["e2e"] = df["finish"] - df["arrival"]
        out = df["output_tokens"]
        df["tpot"] = np.where(out > 1, (df["e2e"] - df["ttft"]) / (out - 1).clip(lower=1), np.nan)
        hi = len(df) if self.measured_to is None else self.measured_to
        df["measured"] = (df["id"] >= self.measured_from) & (df["id"] < hi)
        return df
