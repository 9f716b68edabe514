"""The router in front of a fleet (``splitfuse serve --replicas N``, ``engine.server.router``): every request goes
in and every streamed token comes out through it, one more HTTP hop each way than a single server has."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterCost:
    """Seconds the router's hop adds to a request's way in (``admission_s``: client send to the replica server)
    and to a token's way out (``delivery_s``: replica server to client), on top of the single server's serving
    path. Constants: the hop grows with the load the router carries, which they do not follow
    (``calibration/VALIDATION.md``, twenty-eighth round)."""

    admission_s: float = 0.0
    delivery_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("admission_s", "delivery_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"router {name} must be a number of seconds >= 0, got {value!r}")


# `splitfuse serve --replicas 2`'s router: the mean over five H200 machines' fleet cells of what it added to the
# single server's admission and first-token delivery (`sim.validate.router_hop`; calibration/VALIDATION.md,
# thirty-fifth round: the machines' hops lie 3.0-5.3 ms in and 1.4-2.8 ms out).
SERVE_ROUTER = RouterCost(admission_s=4.56e-3, delivery_s=2.35e-3)
