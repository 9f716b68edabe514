"""Greedy decode steps in the simulator: passes enqueued ahead as the engine's ``pipeline_decodes`` runs them, priced
by the profile's ``greedy_scale`` (fitted by ``calibration.serving.fit_greedy_scale``)."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.serving import ServingModel, fit_greedy_scale
from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import ConstantCost
from sim.workload import Workload

SCALE = {"step": 0.9, "ahead": 0.5, "discarded": 0.25}


class GreedyConstantCost(ConstantCost):
    """Every pass 1 ms; a greedy decode step ``SCALE`` of it as it runs."""

    def greedy_decode_scale(self, features, kind: str) -> float | None:
        return SCALE[kind] if features.num_tokens == features.num_seqs else None


def run(tmp_path, rows: str, temperature: float) -> list[tuple[int, int, float]]:
    """(tokens, sequences, seconds) of every simulated pass of the trace ``rows``."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n" + rows)
    passes = []
    config = ClusterConfig(GreedyConstantCost(1e-3), replicas=1, noise=False, policy=PolicyConfig(token_budget=64))
    simulate(Workload(trace=str(trace), temperature=temperature), config,
             on_pass=lambda replica, plan, start, end, delivered: passes.append(
                 (plan.num_tokens, plan.num_seqs, round((end - start) * 1e3, 6))))
    return passes


def test_a_lone_greedy_request_runs_its_decodes_ahead(tmp_path):
    # prompt (1 ms), the first decode on its own (0.9 ms: a greedy step, after a pass with a prompt), then each
    # enqueued ahead (0.5 ms), the last one too (nothing is enqueued past it)
    passes = run(tmp_path, "0,40,6\n", temperature=0.0)
    assert [p[2] for p in passes] == [1.0, 0.9, 0.5, 0.5, 0.5, 0.5]
    assert [p[2] for p in run(tmp_path, "0,40,6\n", temperature=1.0)] == [1.0] * 6  # sampled: as priced


def test_an_arrival_discards_the_pass_ahead(tmp_path):
    # the second request arrives during the third pass (1.9-2.4 ms): the decode enqueued ahead as the fourth is
    # discarded, and the fourth pass (decode and the new prompt) takes its own 1 ms and the discarded pass's 0.25 ms
    passes = run(tmp_path, "0,40,8\n0.0021,20,2\n", temperature=0.0)
    assert passes[:4] == [(40, 1, 1.0), (1, 1, 0.9), (1, 1, 0.5), (21, 2, 1.25)]


def test_greedy_scale_round_trips_and_is_checked():
    section = ServingModel(greedy_scale=SCALE)
    again = ServingModel.from_dict(section.to_dict())
    assert again.greedy_scale == SCALE and again.greedy_decode_scale("ahead") == 0.5
    assert "greedy_scale" not in ServingModel().to_dict() and ServingModel().greedy_decode_scale("step") is None
    with pytest.raises(ValueError, match="greedy_scale needs exactly the keys step, ahead, discarded"):
        ServingModel(greedy_scale={"step": 1.0})
    with pytest.raises(ValueError, match="greedy_scale"):
        ServingModel(greedy_scale={**SCALE, "ahead": -1.0})


def test_fit_greedy_scale_weighs_each_host_as_one():
    rng = np.random.default_rng(0)
    rows = []
    for host, level, n in (("a", 0.80, 400), ("b", 0.86, 20), ("c", 0.90, 20)):  # host a ran many more steps
        for kind, factor in (("step", 1.0), ("ahead", level), ("discarded", level - 0.2)):
            rows += [{"host": host, "kind": kind, "ratio": factor + rng.normal(0, 0.001)} for _ in range(n)]
    scale, fit = fit_greedy_scale(rows)
    assert scale["ahead"] == pytest.approx(0.86, abs=0.002) and scale["step"] == pytest.approx(1.0, abs=0.002)
    assert scale["discarded"] == pytest.approx(0.66, abs=0.002) and fit["ahead"]["steps"] == 440
    with pytest.raises(ValueError, match="'discarded'"):
        fit_greedy_scale([r for r in rows if r["kind"] != "discarded"])


def test_a_negative_temperature_is_refused_with_its_flag():
    with pytest.raises(ValueError, match="--temperature must be >= 0"):
        Workload(rate=1.0, temperature=-0.5).validate()
