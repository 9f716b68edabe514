"""What each measured host sustains against what the simulator sustains with a profile on the same requests: the
rows of a profile's "hosts" section (``calibration.host_spread``), from the overload runs of ``splitfuse validate``."""

from __future__ import annotations

from pathlib import Path

from calibration.host_spread import MeasuredHost
from sim.cluster import ClusterConfig, simulate
from sim.costs import CostModel
from sim.validate import ServedCost, engine_concurrency, load_measured, run_host, steady_throughput


def measured_hosts(directory: Path, cost: CostModel, host: str | None = None) -> list[MeasuredHost]:
    """One ``MeasuredHost`` per single-engine overload run of ``directory`` (the runs that measured a saturation
    rate): its ``steady_throughput`` as served and as simulated with ``cost`` on the same seeded requests and the KV
    cache the server had. ``host`` overrides the run's recorded host (``run_host``)."""
    meta, runs, _ = load_measured(directory, "calibration")
    label = run_host(meta, directory, host)
    rows = []
    for name, m, info in runs:
        if m.cell.clients or m.cell.load is not None or m.cell.replicas != 1:
            continue  # the warm-up (closed loop), or a fleet's
        concurrency = engine_concurrency(m.cell, info)
        served = ServedCost(cost, info["kv_total_blocks"], info["max_model_len"])
        result = simulate(m.cell.workload(m.rate), ClusterConfig(served, 1, m.cell.policy), seed=m.cell.seed,
                          workload_seed=m.cell.seed)
        rows.append(MeasuredHost(label, name, m.cell.mix,
                                 steady_throughput([r.chunk_times[-1] for r in m.records], concurrency),
                                 steady_throughput(result.columns["finish"], concurrency),
                                 str(meta.get("date", ""))[:10], str(meta.get("commit", ""))))
    return rows
