"""How far does one overload run's steady rate move from one workload seed to the next? (``splitfuse validate``)

``validate`` sets its loads as shares of an overload run's ``steady_throughput``. This replays such runs in the
simulator on a shipped profile, as ``validate`` would send them (rate 3x the simulator's capacity estimate, the
overload seed of each workload seed), at two run lengths, and prints the rate's mean and spread over the seeds.
Writes ``saturation_spread_cpu.json`` to ``--out``.

    python -m benchmarks.saturation_spread                          # llama-2-7b and llama-2-13b on the H200
    python -m benchmarks.saturation_spread --profile llama-2-13b-h200-bf16 --seeds 20
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.common import write_results

# (profile, KV blocks and context as an H200 server reports them for that model)
SERVED = {"llama-2-7b-h200-bf16": (14230, 4096), "llama-2-13b-h200-bf16": (8052, 4096)}


def spread(profile: str, mix: str, seeds: int) -> list[dict]:
    """The steady rate over ``seeds`` workload seeds, for a run of three times the engine's concurrency and for
    ``validate``'s run (``overload_requests``)."""
    import numpy as np

    from calibration.profile import load_profile
    from sim.cluster import ClusterConfig, simulate
    from sim.saturation import estimate_capacity
    from sim.validate import ServedCost, engine_concurrency, make_cells, overload_requests, steady_throughput

    blocks, context = SERVED[profile]
    served = ServedCost(load_profile(profile), blocks, context)
    cell = make_cells([("splitfuse", 768)], [mix], [1.0], [], 150, 0)[0]
    concurrency = engine_concurrency(cell, {"kv_total_blocks": blocks})
    config = ClusterConfig(served, 1, cell.policy)
    rate = 3 * estimate_capacity(config, cell.workload(1.0))
    rows = []
    for label, n in (("3 x concurrency", 3 * concurrency), ("validate", overload_requests(150, concurrency))):
        rates = []
        for seed in range(seeds):
            run = dataclasses.replace(cell, load=None, clients=0, seed=seed + 7919, num_requests=n)
            result = simulate(run.workload(rate), config, seed=seed, workload_seed=run.seed)
            rates.append(steady_throughput(result.columns["finish"], concurrency))
        rates = np.array(rates)
        rows.append({"profile": profile, "mix": mix, "concurrency": concurrency, "run": label, "requests": n,
                     "steady_completions": n - 2 * concurrency, "rate_mean_rps": float(rates.mean()),
                     "rate_cv": float(rates.std() / rates.mean()), "rate_min_rps": float(rates.min()),
                     "rate_max_rps": float(rates.max())})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", choices=sorted(SERVED))
    parser.add_argument("--mix", default="long")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import pandas as pd

    rows = [row for profile in args.profile or sorted(SERVED) for row in spread(profile, args.mix, args.seeds)]
    table = pd.DataFrame(rows).set_index(["profile", "run"])
    table["rate_cv"] *= 100
    print(table.rename(columns={"rate_mean_rps": "rate mean (req/s)", "rate_cv": "CV over seeds (%)",
                                "rate_min_rps": "min (req/s)", "rate_max_rps": "max (req/s)"})
          .to_string(float_format=lambda v: f"{v:.3g}"))
    print(f"wrote {write_results(args.out, 'saturation_spread', rows, card='cpu', seeds=args.seeds, mix=args.mix)}")


if __name__ == "__main__":
    main()
