"""The router in front of a fleet (``splitfuse serve --replicas N``, ``engine.server.router``): every request goes
in and every streamed token comes out through it, one more HTTP hop each way than a single server has."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouterCost:
    """Seconds the router's hop adds to a request's way in (client send to the replica server) and to a token's
    way out (replica server to client), on top of the single server's serving path: ``admission_s`` and
    ``delivery_s``, plus ``*_per_stream_s`` for each stream open at the router then (requests sent and not yet
    finished): one process relays every stream's tokens, so its hop grows with the load it carries."""

    admission_s: float = 0.0
    delivery_s: float = 0.0
    admission_per_stream_s: float = 0.0
    delivery_per_stream_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("admission_s", "delivery_s", "admission_per_stream_s", "delivery_per_stream_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"router {name} must be a number of seconds >= 0, got {value!r}")

    @property
    def per_stream(self) -> bool:
        """Whether the hop depends on the streams open at the router."""
        return bool(self.admission_per_stream_s or self.delivery_per_stream_s)

    def describe(self) -> str:
        return (f"in {self.admission_s * 1e3:.2f} ms + {self.admission_per_stream_s * 1e6:.1f} us per stream, "
                f"out {self.delivery_s * 1e3:.2f} ms + {self.delivery_per_stream_s * 1e6:.1f} us per stream")

    def admission_seconds(self, streams: int) -> float:
        """A request's hop in, sent while ``streams`` others are open at the router."""
        return self.admission_s + self.admission_per_stream_s * streams

    def delivery_seconds(self, streams: int) -> float:
        """A token's hop out while ``streams`` are open at the router (its own among them)."""
        return self.delivery_s + self.delivery_per_stream_s * streams


# `splitfuse serve --replicas 2`'s router: the mean of five H200 machines' lines through their fleet cells' hops
# over the single server's admission and first-token delivery (`sim.validate.router_hop`; calibration/VALIDATION.md,
# thirty-sixth round).
SERVE_ROUTER = RouterCost(admission_s=3.19e-3, delivery_s=0.73e-3, admission_per_stream_s=39.0e-6,
                          delivery_per_stream_s=45.1e-6)
