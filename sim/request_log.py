"""Per-request aggregates of finished requests, kept as compact columns (not Request objects)."""

from __future__ import annotations

from array import array

import numpy as np

from sim.token_stats import GapHistogram, gap_stats

BATCH = 4096  # finished requests whose token times are reduced together


class RequestLog:
    """Collects one row per finished request; ``measured(i)`` says whether request i counts in the statistics
    (warm-up and cool-down requests are kept as rows but left out of the gap histogram). With
    ``keep_token_times`` it also keeps every token's time (``token_times_frame``)."""

    FLOAT_COLUMNS = ("arrival", "scheduled", "first_token", "finish")
    INT_COLUMNS = ("id", "replica", "prompt_tokens", "output_tokens", "preemptions", "cached_tokens")

    def __init__(self, measured_from: int = 0, measured_to: int | None = None,
                 keep_token_times: bool = False) -> None:
        self.columns = {c: array("d") for c in self.FLOAT_COLUMNS}
        self.columns.update({c: array("q") for c in self.INT_COLUMNS})
        self.max_ewm_gap = array("d")
        self.max_mean_gap = array("d")
        self.gaps = GapHistogram()
        self.measured_from = measured_from
        self.measured_to = measured_to
        self._pending: list[list[float]] = []
        self._pending_measured: list[bool] = []
        self.token_times: list[tuple[int, np.ndarray]] | None = [] if keep_token_times else None

    def __len__(self) -> int:
        return len(self.columns["id"])

    def record(self, request, replica: int) -> None:
        """A finished ``Request`` of the simulator."""
        self.add(request.request_id, replica, request.arrival_time, request.scheduled_time,
                 request.first_token_time, request.finish_time, request.num_prompt_tokens,
                 request.num_output_tokens, request.num_preemptions, request.num_cached_tokens, request.token_times)

    def add(self, request_id: int, replica: int, arrival: float, scheduled: float | None, first_token: float,
            finish: float, prompt_tokens: int, output_tokens: int, preemptions: int, cached_tokens: int,
            token_times) -> None:
        """One finished request as plain values (``scheduled`` None or NaN when unknown); ``token_times``: when
        each output token (or each streamed chunk of them) came."""
        c = self.columns
        c["id"].append(request_id)
        c["replica"].append(replica)
        c["arrival"].append(arrival)
        c["scheduled"].append(float("nan") if scheduled is None else scheduled)
        c["first_token"].append(first_token)
        c["finish"].append(finish)
        c["prompt_tokens"].append(prompt_tokens)
        c["output_tokens"].append(output_tokens)
        c["preemptions"].append(preemptions)
        c["cached_tokens"].append(cached_tokens)
        self._pending.append(token_times)
        if self.token_times is not None:
            self.token_times.append((request_id, np.array(token_times, dtype=np.float64)))
        self._pending_measured.append(self.measured_from <= request_id and (self.measured_to is None
                                                                            or request_id < self.measured_to))
        if len(self._pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        max_ewm, max_mean, gaps = gap_stats(self._pending)
        self.max_ewm_gap.extend(max_ewm)
        self.max_mean_gap.extend(max_mean)
        # The histogram takes the gaps of measured requests only: the flat gaps above, less those of unmeasured
        # requests (the same values in the same order as ``gap_stats`` of the measured requests alone).
        if not all(self._pending_measured):
            num_gaps = np.fromiter(map(len, self._pending), dtype=np.int64, count=len(self._pending)) - 1
            gaps = gaps[np.repeat(np.array(self._pending_measured), np.maximum(num_gaps, 0))]
        self.gaps.add(gaps)
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
        if self.token_times is not None:
            self.token_times.extend(other.token_times)

    def token_times_frame(self):
        """A DataFrame with one row per output token: ``id``, ``token`` (0 = the first) and ``time`` (s)."""
        import pandas as pd

        if self.token_times is None:
            raise ValueError("token times were not kept: run with token_times=True (--token-times)")
        kept = sorted(self.token_times, key=lambda item: item[0])
        lengths = [len(times) for _, times in kept]
        return pd.DataFrame({
            "id": np.repeat([i for i, _ in kept], lengths).astype(np.int64),
            "token": np.concatenate([np.arange(n) for n in lengths]) if kept else np.empty(0, dtype=np.int64),
            "time": np.concatenate([times for _, times in kept]) if kept else np.empty(0)})

    def to_columns(self) -> dict[str, np.ndarray]:
        """One row per request, sorted by id, as numpy columns: the columns above plus ttft, tpot, e2e,
        queue_delay, the FastGen statistics ``max_ewm_gap`` and ``max_mean_gap``, and ``measured``."""
        self.flush()
        cols = {name: np.frombuffer(col, dtype=np.float64 if col.typecode == "d" else np.int64)
                for name, col in self.columns.items()}
        cols["max_ewm_gap"] = np.frombuffer(self.max_ewm_gap, dtype=np.float64)
        cols["max_mean_gap"] = np.frombuffer(self.max_mean_gap, dtype=np.float64)
        order = np.argsort(cols["id"], kind="stable")
        cols = {name: col[order] for name, col in cols.items()}
        cols["queue_delay"] = cols["scheduled"] - cols["arrival"]
        cols["ttft"] = cols["first_token"] - cols["arrival"]
        cols["e2e"] = cols["finish"] - cols["arrival"]
        out = cols["output_tokens"]
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["tpot"] = np.where(out > 1, (cols["e2e"] - cols["ttft"]) / np.maximum(out - 1, 1), np.nan)
        cols["measured"] = cols["id"] >= self.measured_from
        if self.measured_to is not None:
            cols["measured"] &= cols["id"] < self.measured_to
        return cols
