"""How the hosts of one card differ, as a profile records it (its optional "hosts" section, from version 11).

Hosts of one card run the same passes a few percent apart (``calibration/VALIDATION.md``). One profile prices one
host's passes, so on the others its capacity is off by that much. For each measured host, the section keeps the
requests/s the host sustained in an overload run of the serving path, and what the simulator, with this profile,
sustains on the same run (``splitfuse validate --from RUN... --record-hosts``). Their ratio is the host's pass-time
factor: 1.03 means the profile would put 3% more through than the host did. ``margin`` is what ``splitfuse plan``
plans for unless told otherwise, on the workload's mix and the replica's scheduler (a factor depends on them as well
as on the host, since the profile misprices some mixes' passes more than others', and some schedulers': llama-3-8b's
full 512-token chunks of long prompts run 3-5% over their price, calibration/VALIDATION.md, fifty-sixth round): the
larger of the slowest measured run's excess and the excess a new host stays under with probability
``HOST_QUANTILE``. The runs are those of the mix served by that scheduler (its name and token budget, as the runs
record it) where there are any, else every run of the mix, whatever served it (a scheduler never measured takes
the worst seen), else (a mix never measured) every run of the scheduler, else every run. The bound is Student's t
prediction bound on those runs' mean log factor, with the card's spread (``CardSpread``) pooled over every profile
measured on the card: a few runs of one profile are too few to show how slow a card can be.

The ratios hold for the profile they were measured against. A row recorded since version 22 carries its overload
run (``run``: the requests, the rate and the KV cache the server had), so that ``splitfuse validate`` simulates it
again whenever it writes the profile; an older row was simulated with the profile of its day. A new serving section
drops the rows (``--fit-serving`` measures its runs' hosts again), and a refit of the cost model from the profile's
own points (``splitfuse profile --refit``) keeps them, as it keeps the serving section. A row measured on an engine
the profile no longer prices is ``retired`` (why, in words; ``splitfuse profile --retire-hosts``): it stays on
record and sets no margin.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

HOST_QUANTILE = 0.99  # the share of a card's hosts that a plan's margin covers (``CardSpread.bound``)
FIELDS = ("host", "scheduler", "mix", "measured_rps", "simulated_rps", "date", "commit", "run", "retired")
REQUIRED = FIELDS[:5]
# what a row's overload run keeps, to be simulated again (``sim.validate.overload_run``)
RUN_KEYS = ("scheduler", "token_budget", "mix", "prompt", "output", "num_requests", "seed", "temperature", "rate",
            "kv_total_blocks", "max_model_len")


def scheduler_name(scheduler: str, token_budget: int) -> str:
    """The name of a scheduler at a token budget, as a measured run records what served it: "splitfuse-512"."""
    return f"{scheduler}-{token_budget}"


@dataclass(frozen=True)
class MeasuredHost:
    """One overload run of one host: what it sustained and what the simulator sustains on the same requests."""

    host: str
    scheduler: str
    mix: str
    measured_rps: float
    simulated_rps: float
    date: str = ""
    commit: str = ""
    run: Mapping | None = None  # the overload run, to simulate again (``sim.validate.simulated_overload_rps``)
    retired: str = ""  # why the row sets no margin any more ("" where it does)

    def __post_init__(self) -> None:
        for name in ("measured_rps", "simulated_rps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                                       and value > 0):
                raise ValueError(f"host {self.host!r}: {name} must be a positive number of requests/s, got {value!r}")
        if self.run is not None:
            missing = [key for key in RUN_KEYS if not isinstance(self.run, Mapping) or key not in self.run]
            if missing:
                raise ValueError(f"host {self.host!r}: run must be an object with {', '.join(RUN_KEYS)} (the "
                                 f"overload run), lacking {', '.join(missing)}")
        if not isinstance(self.retired, str):
            raise ValueError(f"host {self.host!r}: retired must be a text (why), got {self.retired!r}")

    @property
    def factor(self) -> float:
        return self.simulated_rps / self.measured_rps


@dataclass(frozen=True)
class HostSpread:
    """The measured hosts of one profile's card, one row per overload run."""

    runs: tuple[MeasuredHost, ...]

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("a host spread needs at least one measured run")

    @property
    def active(self) -> tuple[MeasuredHost, ...]:
        """The runs that set the margins: those not retired."""
        return tuple(run for run in self.runs if not run.retired)

    def retire(self, commits: set[str], because: str) -> HostSpread:
        """This spread with the runs served by an engine of ``commits`` retired ``because``; a retired run keeps its
        first reason."""
        if not because.strip():
            raise ValueError("say why the runs are retired")
        return HostSpread(tuple(replace(run, retired=because) if run.commit in commits and not run.retired else run
                                for run in self.runs))

    def factors(self) -> dict[str, float]:
        """{host: its pass-time factor}, the mean over its active runs (mixes and schedulers), slowest host first."""
        by_host: dict[str, list[float]] = {}
        for run in self.active:
            by_host.setdefault(run.host, []).append(run.factor)
        means = {host: sum(f) / len(f) for host, f in by_host.items()}
        return dict(sorted(means.items(), key=lambda item: -item[1]))

    def by_mix(self) -> dict[str, list[float]]:
        """{mix: its active runs' log factors, whatever served them}, in the order first named."""
        logs: dict[str, list[float]] = {}
        for run in self.active:
            logs.setdefault(run.mix, []).append(math.log(run.factor))
        return logs

    def groups(self, without: str | None = None) -> dict[tuple[str, str], list[float]]:
        """{(mix, scheduler): the active runs' log factors}, in the order first named: the runs one price error
        is shared by, about whose mean a host's offset is read; ``without``: that host's runs left out."""
        logs: dict[tuple[str, str], list[float]] = {}
        for run in self.active:
            if run.host != without:
                logs.setdefault((run.mix, run.scheduler), []).append(math.log(run.factor))
        return logs

    def _logs(self, mix: str | None, scheduler: str | None, without: str | None = None) -> list[float]:
        """The active runs' log factors a host of ``mix`` served by ``scheduler`` is judged by: those of both, else
        of ``mix`` under every scheduler, else of ``scheduler`` in every mix, else every run; ``without``: leave that
        host's runs out."""
        groups = self.groups(without)
        of_mix = [x for (name, _), logs in groups.items() if name == mix for x in logs]
        of_scheduler = [x for (_, name), logs in groups.items() if name == scheduler for x in logs]
        return groups.get((mix, scheduler)) or of_mix or of_scheduler or [x for logs in groups.values() for x in logs]

    def margin(self, mix: str | None = None, card: CardSpread | None = None,
               quantile: float = HOST_QUANTILE, scheduler: str | None = None) -> float:
        """How much slower than the profile a host may run ``mix`` served by ``scheduler`` (e.g. "splitfuse-512"):
        the slowest of those active runs' excess, or with the ``card``'s spread the ``quantile`` bound on a new
        host's where that is larger (0 where every run kept up, or every run is retired). Where no active run is of
        both (or one is not named): over the runs of ``mix`` of every scheduler, else of ``scheduler`` in every mix,
        else over every run."""
        logs = self._logs(mix, scheduler)
        if not logs:
            return 0.0
        bound = card.bound(logs, quantile) if card is not None else 1.0
        return max(0.0, max(math.exp(max(logs)), bound) - 1)

    def typical(self, mix: str | None = None, scheduler: str | None = None, without: str | None = None) -> float:
        """The pass-time factor of a typical host on ``mix`` served by ``scheduler``: the geometric mean of the
        runs ``margin`` reads (1 where none is active); ``without``: leave that host's runs out, to judge a
        measured host by the others."""
        logs = self._logs(mix, scheduler, without)
        return math.exp(sum(logs) / len(logs)) if logs else 1.0

    def margins(self, card: CardSpread | None = None) -> dict[str, float]:
        """{mix: ``margin(mix, card)``} for each mix the active runs name, in the order first named."""
        return {mix: self.margin(mix, card) for mix in self.by_mix()}

    def scheduler_margins(self, card: CardSpread | None = None) -> dict[tuple[str, str], float]:
        """{(mix, scheduler): its margin} where a mix's runs were served by more than one scheduler."""
        several = {mix for mix, n in Counter(mix for mix, _ in self.groups()).items() if n > 1}
        return {(mix, name): self.margin(mix, card, scheduler=name) for mix, name in self.groups() if mix in several}

    def describe_margins(self, card: CardSpread | None = None) -> str:
        """"long 3.5% (splitfuse-512 16.0%, splitfuse-768 3.1%), short 6.6%; any other mix 6.6%": the margin of
        each mix (of a scheduler it was not measured with: the worst seen), of each of its schedulers where it has
        several, and of the rest."""
        if not self.active:
            return "none (every measured run is retired)"
        by_scheduler = self.scheduler_margins(card)

        def one(mix: str, margin: float) -> str:
            own = [f"{name} {m:.1%}" for (of, name), m in by_scheduler.items() if of == mix]
            return f"{mix} {margin:.1%}" + (f" ({', '.join(own)})" if own else "")

        return (", ".join(one(mix, m) for mix, m in self.margins(card).items())
                + f"; any other mix {self.margin(None, card):.1%}")

    def to_dict(self) -> dict:
        return {"runs": [{k: v for k, v in asdict(run).items() if k in REQUIRED or v not in (None, "")}
                         for run in self.runs]}

    @classmethod
    def from_dict(cls, d: Mapping) -> HostSpread:
        if not isinstance(d, Mapping) or not isinstance(d.get("runs"), list):
            raise ValueError("expected an object with a list of 'runs'")
        runs = []
        for i, row in enumerate(d["runs"]):
            if not isinstance(row, Mapping) or not set(REQUIRED) <= row.keys():
                raise ValueError(f"runs[{i}] must be an object with {', '.join(REQUIRED)}")
            unknown = set(row) - set(FIELDS)
            if unknown:
                raise ValueError(f"runs[{i}] has unknown fields {sorted(unknown)}")
            runs.append(MeasuredHost(**{k: dict(row[k]) if k == "run" and isinstance(row[k], Mapping) else row[k]
                                        for k in FIELDS if k in row}))
        return cls(tuple(runs))


@dataclass(frozen=True)
class CardSpread:
    """How far a card's hosts scatter around a profile's price: the standard deviation of a run's log factor about
    the mean of its profile's runs of its mix and scheduler, pooled over the profiles measured on the card
    (``pooled``), and its degrees of freedom."""

    sd: float
    dof: int

    @classmethod
    def pooled(cls, spreads) -> CardSpread | None:
        """The spread of the hosts of ``spreads`` (HostSpreads of one card); None with fewer than 2 degrees of
        freedom. These count each GPU (host label) once, less one a profile: one GPU's runs of several mixes and
        models sit on the same side of their means (calibration/VALIDATION.md, fifty-second round), so they are
        not independent draws of a card."""
        squares, runs, means, profiles, gpus = 0.0, 0, 0, 0, set()
        for spread in spreads:
            groups = spread.groups()
            for logs in groups.values():
                mean = sum(logs) / len(logs)
                squares += sum((x - mean) ** 2 for x in logs)
                runs, means = runs + len(logs), means + 1
            profiles += bool(groups)
            gpus |= {run.host for run in spread.active}
        dof = len(gpus) - profiles
        return cls(math.sqrt(squares / (runs - means)), dof) if dof >= 2 and runs > means else None

    def bound(self, logs: list[float], quantile: float = HOST_QUANTILE) -> float:
        """The factor a new host stays under with probability ``quantile``, from runs' log factors ``logs``: their
        mean plus Student's t times the spread, widened for the mean's own uncertainty (a prediction bound)."""
        from scipy.stats import t

        if not 0.5 <= quantile < 1:
            raise ValueError(f"a host quantile must be in [0.5, 1), got {quantile!r}")
        n = len(logs)
        return math.exp(sum(logs) / n + float(t.ppf(quantile, self.dof)) * self.sd * math.sqrt(1 + 1 / n))
