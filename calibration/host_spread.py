"""How the hosts of one card differ, as a profile records it (its optional "hosts" section, from version 11).

Hosts of one card run the same passes a few percent apart (``calibration/VALIDATION.md``). One profile prices one
host's passes, so on the others its capacity is off by that much. For each measured host, the section keeps the
requests/s the host sustained in an overload run of the serving path, and what the simulator, with this profile,
sustains on the same run (``splitfuse validate --from RUN... --record-hosts``). Their ratio is the host's pass-time
factor: 1.03 means the profile would put 3% more through than the host did. ``margin`` is the slowest measured
run's excess on the workload planned (its mix; any mix where none of it was measured), what ``splitfuse plan``
plans for unless told otherwise: a factor depends on the mix as well as the host (the profile misprices some
mixes' passes more than others'), and a plan must hold on the slowest card for its own mix.

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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

FIELDS = ("host", "scheduler", "mix", "measured_rps", "simulated_rps", "date", "commit", "run", "retired")
REQUIRED = FIELDS[:5]


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
        if self.run is not None and not isinstance(self.run, Mapping):
            raise ValueError(f"host {self.host!r}: run must be an object (the overload run), got {self.run!r}")
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

    def margin(self, mix: str | None = None) -> float:
        """How much slower than the profile the slowest active run of ``mix`` ran (0 where every run kept up, or
        every run is retired); where no active run is of ``mix`` (or none is named), the slowest of any mix."""
        runs = [run for run in self.active if run.mix == mix] or self.active
        return max(0.0, max((run.factor for run in runs), default=1.0) - 1)

    def margins(self) -> dict[str, float]:
        """{mix: ``margin(mix)``} for each mix the active runs name, in the order first named."""
        return {mix: self.margin(mix) for mix in dict.fromkeys(run.mix for run in self.active)}

    def describe_margins(self) -> str:
        """"long 3.5%, short 6.6%; any other mix 6.6%": the margin of each mix and of the rest."""
        if not self.active:
            return "none (every measured run is retired)"
        return (", ".join(f"{mix} {m:.1%}" for mix, m in self.margins().items())
                + f"; any other mix {self.margin():.1%}")

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
