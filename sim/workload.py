"""Workloads: request lengths, arrival processes (Poisson, gamma, closed-loop clients) and trace replay.

A workload becomes a ``RequestTable``: numpy columns in arrival order. Closed-loop workloads have no arrival
times in advance (``arrivals`` is None); the cluster stamps them when a client sends.

``Workload``'s field defaults are those of ``splitfuse simulate`` (the command reads them from here), and it takes
the command's length specs (``prompt="normal:2600:0.3"``) as well as ``LengthDist`` objects.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARRIVALS = ("poisson", "gamma", "closed", "trace")
FASTGEN_MAX_PROMPT_TOKENS = 4000  # FastGen's benchmark clips sampled prompts here
# The named mixes of `splitfuse validate`'s grids, (prompt lengths, output lengths); a profile's measured hosts name
# the mix each of their overload runs served (calibration.host_spread).
MIXES = {
    "long": ("normal:2600:0.3", "normal:128:0.3"),
    "short": ("normal:512:0.3", "normal:256:0.3"),
    "fastgen": ("normal:2600:0.3", "normal:60:0.3"),  # DeepSpeed-FastGen's headline workload
}


@dataclass
class RequestTable:
    arrivals: np.ndarray | None  # seconds, non-decreasing; None for closed-loop
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_ids: np.ndarray | None = None  # object array (None = no shared prefix)
    prefix_lens: np.ndarray | None = None
    lines: np.ndarray | None = None  # a trace's rows: the file line each request came from

    def name(self, i: int) -> str:
        """How an error names request ``i``: its trace file line, else its row in the table."""
        return f"trace line {int(self.lines[i])}" if self.lines is not None else f"request row {i}"

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

    def __str__(self) -> str:
        """The spec string ``parse_length`` reads back."""
        args = self.args[:2] if self.kind == "file" else (f"{a:g}" for a in self.args)
        return ":".join((self.kind, *map(str, args)))


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
    if not path.is_file():
        raise ValueError(f"{flag}: no such file {str(path)!r}")
    rows = _read_rows(path, flag)
    values = []
    for line, row in rows:
        if column not in row:
            raise ValueError(f"{flag}: {str(path)!r} line {line} has no column {column!r} "
                             f"(columns: {', '.join(row)})")
        try:
            value = float(row[column])
        except (TypeError, ValueError):
            value = float("nan")
        if not value >= 1:
            raise ValueError(f"{flag}: {str(path)!r} line {line}: {column} = {row[column]!r} is not a length >= 1")
        values.append(value)
    if not values:
        raise ValueError(f"{flag}: {str(path)!r} has no rows")
    return np.asarray(values)


# -- arrivals ------------------------------------------------------------------------------------------------
@dataclass
class Workload:
    """What to send. ``rate`` in requests/s for the open-loop arrivals; ``cv`` is the gamma arrivals'
    coefficient of variation (1 = Poisson, >1 burstier); ``clients`` for closed loop; ``max_concurrency`` caps the
    open loop's requests in flight (vLLM's ``--max-concurrency``: a request due at the cap waits for the first to
    finish, in arrival order, and its latencies start when it is sent). ``arrivals`` None means
    trace replay when a ``trace`` is given, else Poisson. Without a ``rate``, open-loop arrivals come at ``load``
    times the cluster's estimated saturation rate (``sim.saturation.with_rate``, which ``simulate`` applies).
    ``prompt``/``output``: a ``LengthDist`` or its spec string. Sampled prompts are clipped at
    ``max_prompt_tokens`` (None: not clipped); a trace is never clipped. ``temperature``: every request's sampling
    temperature (0: greedy, whose decode steps the engine may enqueue ahead)."""

    num_requests: int = 2000
    arrivals: str | None = None
    rate: float | None = None
    load: float = 0.8
    cv: float = 1.0
    clients: int = 0
    max_concurrency: int | None = None
    prompt: LengthDist | str = LengthDist("normal", (2600.0, 0.3))
    output: LengthDist | str = LengthDist("normal", (128.0, 0.3))
    trace: str | Path | None = None
    max_prompt_tokens: int | None = FASTGEN_MAX_PROMPT_TOKENS
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, LengthDist):
            self.prompt = parse_length(self.prompt, "--prompt-len")
        if not isinstance(self.output, LengthDist):
            self.output = parse_length(self.output, "--output-len")
        if self.arrivals is None:
            self.arrivals = "trace" if self.trace else "poisson"

    def validate(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"--temperature must be >= 0, got {self.temperature!r}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"--arrivals {self.arrivals!r}: choose one of {', '.join(ARRIVALS)}")
        if self.trace and self.arrivals != "trace":
            raise ValueError(f"--trace is replayed at its own arrival times; --arrivals {self.arrivals} would "
                             "ignore it (drop --arrivals)")
        if self.arrivals == "trace":
            if not self.trace:
                raise ValueError("--trace: a trace file is needed for trace arrivals")
            if self.rate is not None:
                raise ValueError("--rate: a trace is replayed at its own arrival times; drop --rate")
            self._validate_max_concurrency()
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
        self._validate_max_concurrency()

    def _validate_max_concurrency(self) -> None:
        if self.max_concurrency is None:
            return
        if self.arrivals == "closed":
            raise ValueError("--max-concurrency caps open-loop arrivals; a closed loop's cap is its --clients")
        if not isinstance(self.max_concurrency, (int, np.integer)) or self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency!r}")

    def generate(self, seed: int) -> RequestTable:
        """The requests of this workload for ``seed`` (lengths, and arrival times for open loop)."""
        self.validate()
        if self.arrivals == "trace":
            path = Path(self.trace)
            stat = path.stat() if path.is_file() else None
            return _read_trace_once(str(path), stat and (stat.st_mtime_ns, stat.st_size))
        rng = np.random.default_rng([seed, 0x5EED])
        n = int(self.num_requests)
        arrivals = None
        if self.arrivals == "poisson":
            arrivals = np.cumsum(rng.exponential(1.0 / self.rate, size=n))
        elif self.arrivals == "gamma":
            shape = 1.0 / (self.cv * self.cv)
            arrivals = np.cumsum(rng.gamma(shape, 1.0 / (self.rate * shape), size=n))
        prompts, outputs = self._lengths(rng, n)
        return RequestTable(arrivals, prompts, outputs)

    def _lengths(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        prompts = self.prompt.sample(rng, n)
        if self.max_prompt_tokens is not None:
            np.minimum(prompts, self.max_prompt_tokens, out=prompts)
        return prompts, self.output.sample(rng, n)

    def mean_lengths(self) -> tuple[float, float]:
        """Mean prompt and output tokens: the trace's own, else those of a large seeded sample (clipped as
        ``generate`` clips)."""
        if self.arrivals == "trace":
            table = self.generate(0)
            return float(table.prompt_tokens.mean()), float(table.output_tokens.mean())
        prompts, outputs = self._lengths(np.random.default_rng(0), 4096)
        return float(prompts.mean()), float(outputs.mean())


# -- trace replay --------------------------------------------------------------------------------------------
TRACE_COLUMNS = ("arrival_time", "prompt_tokens", "output_tokens")
# Other tools' names for them (compared lower-case, spaces as underscores): Vidur's trace files; the BurstGPT
# trace that vLLM's benchmark replays ("Timestamp", "Request tokens", "Response tokens"); vLLM's per-request
# input_len/output_len; and a few common spellings. Every time is in seconds.
TRACE_ALIASES = {
    "arrived_at": "arrival_time", "num_prefill_tokens": "prompt_tokens", "num_decode_tokens": "output_tokens",
    "request_tokens": "prompt_tokens", "response_tokens": "output_tokens",
    "input_len": "prompt_tokens", "output_len": "output_tokens", "prompt_len": "prompt_tokens",
    "input_tokens": "prompt_tokens", "arrival": "arrival_time", "timestamp": "arrival_time",
}


def mix_name(workload: Workload) -> str | None:
    """The name (``MIXES``) of the mix whose lengths ``workload`` draws, or None (a trace, or lengths of no named
    mix)."""
    if workload.arrivals == "trace":
        return None
    return next((name for name, (prompt, output) in MIXES.items()
                 if parse_length(prompt) == workload.prompt and parse_length(output) == workload.output), None)


def trace_column(name: str) -> str:
    """The trace column a header names (``TRACE_ALIASES``), or the header itself."""
    key = name.strip().lower().replace(" ", "_")
    return TRACE_ALIASES.get(key, key)


@functools.lru_cache(maxsize=4)
def _read_trace_once(path: str, version) -> RequestTable:
    """``read_trace``, once per file version (a run reads its trace for the capacity estimate and each seed)."""
    return read_trace(path)


def read_trace(path: str | Path) -> RequestTable:
    """CSV or JSONL rows of arrival_time (s), prompt_tokens, output_tokens and optional prefix_id, prefix_len,
    under these names or another tool's (``TRACE_ALIASES``).

    Rows are sorted by arrival; a malformed row raises ValueError naming its file line.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--trace: no such file {str(path)!r}")
    rows = _read_rows(path, "--trace")
    if not rows:
        raise ValueError(f"--trace {str(path)!r}: no requests")
    arrivals, prompts, outputs, pids, plens = [], [], [], [], []
    for line, row in rows:
        row = {trace_column(k): v for k, v in row.items()}

        def bad(why: str, line=line, row=row) -> ValueError:
            return ValueError(f"--trace {str(path)!r} line {line}: {why} (row: {row})")

        missing = [c for c in TRACE_COLUMNS if row.get(c) in (None, "")]
        if missing:
            raise bad(f"missing {', '.join(missing)} (also read as: "
                      + "; ".join(f"{c}: {', '.join(a for a, t in TRACE_ALIASES.items() if t == c)}" for c in missing)
                      + ")")
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
                         np.asarray(outputs, dtype=np.int64)[order],
                         lines=np.asarray([line for line, _ in rows], dtype=np.int64)[order])
    if any(pid is not None for pid in pids):
        table.prefix_ids = np.asarray(pids, dtype=object)[order]
        table.prefix_lens = np.asarray(plens, dtype=np.int64)[order]
    return table


def _as_int(v) -> int:
    f = float(v)
    if f != int(f):
        raise ValueError(v)
    return int(f)


def _read_rows(path: Path, flag: str) -> list[tuple[int, dict]]:
    """(file line, row as a dict) of each non-blank row of a CSV or JSONL file."""
    return _read_jsonl(path, flag) if path.suffix in (".jsonl", ".json") else _read_csv(path, flag)


def _read_csv(path: Path, flag: str) -> list[tuple[int, dict]]:
    import csv

    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise ValueError(f"{flag} {str(path)!r}: empty file")
        header = [h.strip() for h in header]
        rows = []
        for values in reader:
            if not values or not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise ValueError(f"{flag} {str(path)!r} line {reader.line_num}: {len(values)} fields for "
                                 f"{len(header)} columns ({', '.join(header)})")
            rows.append((reader.line_num, dict(zip(header, (v.strip() for v in values)))))
    return rows


def _read_jsonl(path: Path, flag: str) -> list[tuple[int, dict]]:
    rows = []
    with path.open() as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{flag} {str(path)!r} line {line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{flag} {str(path)!r} line {line_no}: expected a JSON object")
            rows.append((line_no, row))
    return rows
