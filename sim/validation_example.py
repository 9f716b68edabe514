"""The example validation file: the simulator run against itself on a CPU, in the long format of
``calibration.validation_results`` (kind=example, NOT a GPU measurement).

Its "sim" rows run on the profile's median pass times (no noise); its "server" rows are the same seeded workloads
with the profile's measured spread of pass times; its "client" rows the same with the next seed (a second
measurement). So its errors show only what pass-time noise and the seed do, which a real validation must beat.

    python -m sim.validation_example [OUT.csv]
"""

from __future__ import annotations

import sys
from pathlib import Path

from calibration.validation_results import CELL, METRICS, VALIDATION_DIR
from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.metrics import summarize
from sim.saturation import estimate_capacity
from sim.workload import Workload

OUT = VALIDATION_DIR / "example-sim-vs-sim.csv"
PROFILE = "llama-2-7b"
MIXES = {"long-prompt": ("normal:2600:0.3", "normal:128:0.3"), "chat": ("normal:512:0.3", "normal:256:0.3")}
SCHEDULERS = {"splitfuse": 768, "prefill-first": 4400}  # token budgets: prefill-first runs whole prompts
LOADS = (0.5, 0.8)
REQUESTS = 300
NOTE = "kind=example, not a GPU measurement: the simulator against itself on a CPU"


def rows() -> list[dict]:
    out = []
    for mix, (prompt, output) in MIXES.items():
        for scheduler, budget in SCHEDULERS.items():
            policy = PolicyConfig(scheduler=scheduler, token_budget=budget)
            for load in LOADS:
                workload = Workload(num_requests=REQUESTS, prompt=prompt, output=output)
                rate = load * estimate_capacity(ClusterConfig(PROFILE, replicas=1, policy=policy), workload)
                workload.rate = rate
                for source, noise, seed in (("sim", False, 0), ("server", True, 0), ("client", True, 1)):
                    config = ClusterConfig(PROFILE, replicas=1, policy=policy, noise=noise)
                    summary = summarize(simulate(workload, config, seed=seed, warmup=0.1))
                    out.append({"grid": "example-sim-vs-sim", "kind": "example", "source": source,
                                "scheduler": scheduler, "mix": mix, "load": load, "rate_rps": round(rate, 4),
                                "seed": seed, "profile": PROFILE,
                                **{m: round(float(summary[m]), 6) for m in METRICS}, "note": NOTE})
    return out


def write(path: str | Path = OUT) -> Path:
    import pandas as pd

    frame = pd.DataFrame(rows())
    assert list(frame.columns[2:6]) == ["source", *CELL]
    path = Path(path)
    frame.to_csv(path, index=False)
    return path


if __name__ == "__main__":
    print(f"wrote {write(*sys.argv[1:2])}")
