"""Workloads: request lengths, arrival processes (Poisson, gamma, closed-loop clients) and trace replay.

A workload becomes a ``RequestTable``: numpy columns in arrival order. Closed-loop workloads have no arrival
times in advance (``arrivals`` is None); the cluster stamps them when a client sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARRIVALS = ("poisson", "gamma", "closed", "trace")


@dataclass
class RequestTable:
    arrivals: np.ndarray | None  # seconds, non-decreasing; None for closed-loop
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_ids: np.ndarray | None = None  # object array (None = no shared prefix)
    prefix_lens: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.prompt_tokens)


# -- lengths -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthDist:
    """``fixed:N``, ``uniform:LO:HI``, ``normal:MEAN:REL`` (std = REL x MEAN, FastGen's "variance"),
    ``lognormal:MEAN:SIGMA`` (SIGMA of the log) or ``file:PATH:COLUMN`` (sampled with replacement)."""

    kind: str
    args: tuple

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        k, a = self.kind, self.args
        if k == "fixed":
            x = np.full(n, a[0], dtype=float)
        elif k == "uniform":
            x = rng.integers(int(a[0]), int(a[1]) + 1, size=n).astype(float)
        elif k == "normal":
            x = rng.normal(a[0], a[0] * a[1], size=n)
        elif k == "lognormal":
            mean, sigma = a
            x = rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, size=n)
        else:  # file
            x = rng.choice(a[2], size=n)
        return np.maximum(1, np.rint(x)).astype(np.int64)


def parse_length(spec: str | int, flag: str = "--prompt-len") -> LengthDist:
    """Parse a length spec (see ``LengthDist``); a bare integer means fixed. ValueError names ``flag``."""
    text = str(spec).strip()
    parts = text.split(":")
    kind = parts[0] if not parts[0].lstrip("-").isdigit() else "fixed"
    args = parts[1:] if kind != "fixed" or parts[0] == "fixed" else parts

    def bad(why: str) -> ValueError:
        return ValueError(f"{flag} {text!r}: {why}; use fixed:N, uniform:LO:HI, normal:MEAN:REL, "
                          "lognormal:MEAN:SIGMA or file:PATH:COLUMN")

    if kind == "file":
        if len(args) != 2:
            raise bad("expected file:PATH:COLUMN")
        path, column = args
        values = _read_column(Path(path), column, flag)
        return LengthDist("file", (path, column, values))
    expected = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}
    if kind not in expected:
        raise bad(f"unknown kind {kind!r}")
    if len(args) != expected[kind]:
        raise bad(f"{kind} takes {expected[kind]} number(s)")
    try:
        nums = tuple(float(x) for x in args)
    except ValueError:
        raise bad("not a number") from None
    if kind in ("fixed", "uniform") and any(x < 1 for x in nums) or kind in ("normal", "lognormal") and nums[0] < 1:
        raise bad("lengths must be >= 1")
    if kind == "uniform" and nums[1] < nums[0]:
        raise bad("HI < LO")
    if kind in ("normal", "lognormal") and nums[1] < 0:
        raise bad("spread must be >= 0")
    return LengthDist(kind, nums)


def _read_column(path: Path, column: str, flag: str) -> np.ndarray:
    import pandas as pd

    if not path.is_file():
        raise ValueError(f"{flag}: no such file {str(path)!r}")
    df = pd.read_json(path, lines=True) if path.suffix == ".jsonl" else pd.read_csv(path)
    if column not in df.columns:
        raise ValueError(f"{flag}: {str(path)!r} has no column {column!r} (columns: {', '.join(df.columns)})")
    values = pd.to_numeric(df[column], errors="coerce").to_numpy()
    bad = np.flatnonzero(~(values >= 1))
    if bad.size:
        raise ValueError(f"{flag}: {str(path)!r} row {bad[0] + 1}: {column} = {df[column].iloc[bad[0]]!r} is not "
                         "a length >= 1")
    return values.astype(float)


# -- arrivals ------------------------------------------------------------------------------------------------
@dataclass
class Workload:
    """What to send. ``rate`` in requests/s for the open-loop arrivals; ``cv`` is the gamma arrivals'
    coefficient of variation (1 = Poisson, >1 burstier); ``clients`` for closed loop."""

    num_requests: int = 1000
    arrivals: str = "poisson"
    rate: float | None = None
    cv: float = 1.0
    clients: int = 0
    prompt: LengthDist = LengthDist("normal", (2600.0, 0.3))
    output: LengthDist = LengthDist("normal", (128.0, 0.3))
    trace: str | None = None
    max_prompt_tokens: int | None = None  # clip sampled prompts (FastGen's benchmark caps them at 4,000)

    def validate(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"--arrivals {self.arrivals!r}: choose one of {', '.join(ARRIVALS)}")
        if self.arrivals == "trace":
            if not self.trace:
                raise ValueError("--trace: a trace file is needed for trace arrivals")
            return
        if not isinstance(self.num_requests, (int, np.integer)) or self.num_requests < 1:
            raise ValueError(f"--num-requests must be >= 1, got {self.num_requests!r}")
        if self.arrivals in ("poisson", "gamma"):
            if self.rate is None or not np.isfinite(self.rate) or self.rate <= 0:
                raise ValueError(f"--rate must be a positive number of requests per second, got {self.rate!r}")
        if self.arrivals == "gamma" and not self.cv > 0:
            raise ValueError(f"--cv must be > 0, got {self.cv!r}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"--max-prompt-len must be >= 1, got {self.max_prompt_tokens!r}")
        if self.arrivals == "closed" and self.clients < 1:
            raise ValueError(f"--clients must be >= 1 for closed-loop arrivals, got {self.clients!r}")

    def generate(self, seed: int) -> RequestTable:
        """The requests of this workload for ``seed`` (lengths, and arrival times for open loop)."""
        self.validate()
        if self.arrivals == "trace":
            return read_trace(self.trace)
        rng = np.random.default_rng([seed, 0x5EED])
        n = int(self.num_requests)
        arrivals = None
        if self.arrivals == "poisson":
            arrivals = np.cumsum(rng.exponential(1.0 / self.rate, size=n))
        elif self.arrivals == "gamma":
            shape = 1.0 / (self.cv * self.cv)
            arrivals = np.cumsum(rng.gamma(shape, 1.0 / (self.rate * shape), size=n))
        prompts = self.prompt.sample(rng, n)
        if self.max_prompt_tokens is not None:
            np.minimum(prompts, self.max_prompt_tokens, out=prompts)
        return RequestTable(arrivals, prompts, self.output.sample(rng, n))


# -- trace replay --------------------------------------------------------------------------------------------
TRACE_COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens")
TRACE_ALIASES = {"arrival": "arrival_time", "timestamp": "arrival_time", "prompt_len": "prompt_tokens",
                 "output_len": "output_tokens", "input_tokens": "prompt_tokens"}


def read_trace(path: str | Path) -> RequestTable:
    """CSV or JSONL rows of arrival_time, prompt_tokens, output_tokens and optional prefix_id, prefix_len.

    Rows are sorted by arrival; a malformed row raises ValueError naming its file line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--trace: no such file {str(path)!r}")
    rows = _read_jsonl(path) if path.suffix in (".jsonl", ".json") else _read_csv(path)
    if not rows:
        raise ValueError(f"--trace {str(path)!r}: no requests")
    arrivals, prompts, outputs, pids, plens = [], [], [], [], []
    for line, row in rows:
        row = {TRACE_ALIASES.get(k, k): v for k, v in row.items()}

        def bad(why: str, line=line, row=row) -> ValueError:
            return ValueError(f"--trace {str(path)!r} line {line}: {why} (row: {row})")

        missing = [c for c in TRACE_COLUMNS if row.get(c) in (None, "")]
        if missing:
            raise bad(f"missing {', '.join(missing)}")
        try:
            t = float(row["arrival_time"])
            p, o = _as_int(row["prompt_tokens"]), _as_int(row["output_tokens"])
            plen = _as_int(row["prefix_len"]) if row.get("prefix_len") not in (None, "") else 0
        except (TypeError, ValueError):
            raise bad("arrival_time must be a number and token counts integers") from None
        if not np.isfinite(t) or t < 0:
            raise bad("arrival_time must be a finite number >= 0")
        if p < 1 or o < 1:
            raise bad("prompt_tokens and output_tokens must be >= 1")
        pid = row.get("prefix_id")
        pid = None if pid in (None, "") or (isinstance(pid, float) and np.isnan(pid)) else str(pid)
        if plen < 0 or plen > p:
            raise bad("prefix_len must be in [0, prompt_tokens]")
        arrivals.append(t), prompts.append(p), outputs.append(o), pids.append(pid), plens.append(plen)
    order = np.argsort(np.asarray(arrivals), kind="stable")
    table = RequestTable(np.asarray(arrivals)[order], np.asarray(prompts, dtype=np.int64)[order],
                         np.asarray(outputs, dtype=np.int64)[order])
    if any(pid is not None for pid in pids):
        table.prefix_ids = np.asarray(pids, dtype=object)[order]
        table.prefix_lens = np.asarray(plens, dtype=np.int64)[order]
    return table


def _as_int(v) -> int:
    f = float(v)
    if f != int(f):
        raise ValueError(v)
    return int(f)


def _read_csv(path: Path) -> list[tuple[int, dict]]:
    import csv

    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise ValueError(f"--trace {str(path)!r}: empty file")
        header = [h.strip() for h in header]
        rows = []
        for values in reader:
            if not values or not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise ValueError(f"--trace {str(path)!r} line {reader.line_num}: {len(values)} fields for "
                                 f"{len(header)} columns ({', '.join(header)})")
            rows.append((reader.line_num, dict(zip(header, (v.strip() for v in values)))))
    return rows


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    rows = []
    with path.open() as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"--trace {str(path)!r} line {line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"--trace {str(path)!r} line {line_no}: expected a JSON object")
            rows.append((line_no, row))
    return rows
