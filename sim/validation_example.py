"""The example validation file: the simulator run against itself on a CPU, in the format ``splitfuse validate``
writes (``validation.csv``; read by ``calibration.validation_results``), kind=example, NOT a GPU measurement.

Its "sim" rows run on the profile's median pass times (no noise); its "server" rows are the same seeded workloads
with the profile's measured spread of pass times; its "client" rows the same with the next seed (``run_seed``), a
second measurement. So its errors show only what pass-time noise and the seed do, which a real validation must
beat. Loads are shares of the *estimated* capacity here (``splitfuse validate`` measures the saturation rate).

    python -m sim.validation_example [OUT.csv]
"""

from __future__ import annotations

import sys
from pathlib import Path

from calibration.validation_results import VALIDATION_DIR
from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.metrics import summarize
from sim.saturation import estimate_capacity
from sim.validate import MIXES, Cell, metric_columns

OUT = VALIDATION_DIR / "example-sim-vs-sim.csv"
PROFILE = "llama-2-7b"
SCHEDULERS = {"splitfuse": 768, "prefill-first": 4400}  # token budgets: prefill-first runs whole prompts
LOADS = (0.5, 0.8)
REQUESTS = 300
NOTE = "kind=example, not a GPU measurement: the simulator against itself on a CPU"


def rows() -> list[dict]:
    out = []
    for mix in ("long", "short"):
        for scheduler, budget in SCHEDULERS.items():
            policy = PolicyConfig(scheduler=scheduler, max_num_batched_tokens=budget)
            for load in LOADS:
                cell = Cell(scheduler, budget, mix, *MIXES[mix], REQUESTS, load=load)
                rate = load * estimate_capacity(ClusterConfig(PROFILE, 1, policy), cell.workload())
                for source, noise, seed in (("sim", False, cell.seed), ("server", True, cell.seed),
                                            ("client", True, cell.seed + 1)):
                    summary = summarize(simulate(cell.workload(rate), ClusterConfig(PROFILE, 1, policy, noise),
                                                 seed=seed))
                    out.append({"grid": "example-sim-vs-sim", "kind": "example", **cell.keys(),
                                "rate": round(rate, 4), "source": source, "run_seed": seed,
                                **{k: round(float(v), 6) for k, v in metric_columns(summary).items()},
                                "note": NOTE})
    return out


def write(path: str | Path = OUT) -> Path:
    import pandas as pd

    path = Path(path)
    pd.DataFrame(rows()).to_csv(path, index=False)
    return path


if __name__ == "__main__":
    print(f"wrote {write(*sys.argv[1:2])}")
