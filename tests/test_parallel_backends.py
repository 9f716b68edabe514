"""Local processes and Ray give the same sweep for the same seeds: each task carries its own seed."""

import pandas as pd
import pytest

from engine.policy import PolicyConfig
from sim.capacity import load_sweep
from sim.cluster import ClusterConfig
from sim.costs import LinearCost
from sim.parallel import run_map
from sim.workload import Workload

COST = LinearCost(base=0.01, per_token=1e-4, noise_sigma=0.05, num_kv_blocks=2000)
WORKLOAD = Workload(num_requests=200, prompt="uniform:100:500", output="uniform:10:40")
CONFIG = ClusterConfig(COST, replicas=2, policy=PolicyConfig(token_budget=512, balancer="least-requests"))


def test_local_processes_give_the_single_process_sweep():
    one = load_sweep(WORKLOAD, CONFIG, [5.0, 15.0], seeds=range(3), processes=1)
    two = load_sweep(WORKLOAD, CONFIG, [5.0, 15.0], seeds=range(3), processes=2)
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert list(one["seed"]) == [0, 1, 2, 0, 1, 2] and "queue_growth" in one


def test_ray_gives_the_local_sweep():
    ray = pytest.importorskip("ray", reason="the ray extra (pip install 'splitfuse[ray]'); CI installs it")
    local = load_sweep(WORKLOAD, CONFIG, [5.0, 15.0], seeds=range(3), processes=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = load_sweep(WORKLOAD, CONFIG, [5.0, 15.0], seeds=range(3), backend="ray")
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(local, on_ray, check_exact=True)


def test_bad_backend_options_name_the_flag():
    with pytest.raises(ValueError, match="--backend"):
        run_map(abs, [1], backend="dask")
    with pytest.raises(ValueError, match="--ray-address"):
        run_map(abs, [1], ray_address="127.0.0.1:6379")
    with pytest.raises(ValueError, match="--processes"):
        run_map(abs, [1], processes=0)
