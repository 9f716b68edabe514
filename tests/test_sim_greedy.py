"""Greedy decode steps in the simulator: passes enqueued ahead as the engine's ``pipeline_decodes`` runs them, priced
by the profile's ``greedy`` section (fitted by ``calibration.serving.fit_greedy``)."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.serving import ServingModel, fit_greedy
from engine.policy import PolicyConfig
from sim.cluster import ClusterConfig, simulate
from sim.costs import ConstantCost
from sim.workload import Workload

# a step on its own 0.1 ms less than its price, one ahead 0.4 ms + 0.1 ms a sampled entry less, a discarded one adds
# 0.25 of its price
GREEDY = {"step_saved_s": 0.1e-3, "step_saved_per_sample_s": 0.0, "ahead_saved_s": 0.4e-3,
          "ahead_saved_per_sample_s": 0.1e-3, "discarded": 0.25}


class GreedyConstantCost(ConstantCost):
    """Every pass 1 ms; a greedy decode step as ``GREEDY``'s section prices it."""

    section = ServingModel(greedy=GREEDY)

    def greedy_seconds(self, features, kind: str, price: float) -> float | None:
        if features.num_tokens != features.num_seqs:
            return None
        return self.section.greedy_seconds(kind, price, features.num_samples)


def run(tmp_path, rows: str, temperature: float) -> list[tuple[int, int, float]]:
    """(tokens, sequences, milliseconds) of every simulated pass of the trace ``rows``."""
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
    # enqueued ahead (1 ms less 0.4 + 0.1 ms), the last one too (nothing is enqueued past it)
    passes = run(tmp_path, "0,40,6\n", temperature=0.0)
    assert [p[2] for p in passes] == [1.0, 0.9, 0.5, 0.5, 0.5, 0.5]
    assert [p[2] for p in run(tmp_path, "0,40,6\n", temperature=1.0)] == [1.0] * 6  # sampled: as priced


def test_a_step_ahead_of_more_sequences_hides_more_host_work(tmp_path):
    # two prompts in one pass (1 ms), their first decode on its own (0.9 ms), then two-sequence steps ahead, each
    # 1 ms less 0.4 + 2 x 0.1 ms
    passes = run(tmp_path, "0,20,5\n0,20,5\n", temperature=0.0)
    assert passes == [(40, 2, 1.0), (2, 2, 0.9), (2, 2, 0.4), (2, 2, 0.4), (2, 2, 0.4)]


def test_an_arrival_discards_the_pass_ahead(tmp_path):
    # the second request arrives during the third pass (1.9-2.4 ms): the decode enqueued ahead as the fourth is
    # discarded, and the fourth pass (decode and the new prompt) takes its own 1 ms and the discarded pass's 0.25 ms
    passes = run(tmp_path, "0,40,8\n0.0021,20,2\n", temperature=0.0)
    assert passes[:4] == [(40, 1, 1.0), (1, 1, 0.9), (1, 1, 0.5), (21, 2, 1.25)]


def test_greedy_seconds_by_kind():
    section = ServingModel(greedy=GREEDY)
    assert section.greedy_seconds("step", 10e-3, 8) == pytest.approx(9.9e-3)
    assert section.greedy_seconds("ahead", 10e-3, 8) == pytest.approx(10e-3 - 0.4e-3 - 0.8e-3)
    assert section.greedy_seconds("ahead", 1e-3, 100) == 0.0  # never below nothing
    assert section.greedy_seconds("discarded", 10e-3, 8) == pytest.approx(2.5e-3)
    assert ServingModel().greedy_seconds("ahead", 10e-3, 8) is None


def test_a_profile_prices_greedy_graph_passes_and_runs_only_decode_steps_ahead():
    """A graph pass that samples takes its argmax inside the graph (the "step" saving, mixed passes too); only a
    decode step runs ahead; a pass that samples nothing, or an eager one, is priced as it is."""
    from calibration.profile import load_profile
    from engine.policy import PassFeatures

    profile = load_profile("llama-2-7b-h200-bf16")
    swept = ServingModel.from_dict({**profile.serving.to_dict(), "sampler_saved": {}})  # the sweep's sampler
    profile = profile.with_serving(swept.with_greedy(GREEDY))
    decode = PassFeatures(32, 0, 32, 32, 0, 32 * 500, 0, 32)
    mixed = PassFeatures(544, 512, 32, 33, 1, 32 * 500, 512 * 700, 33)
    chunk = PassFeatures(512, 512, 0, 1, 1, 0, 512 * 300, 0)
    eager = PassFeatures(2048, 2000, 48, 49, 1, 48 * 500, 2000 * 1000, 49)
    assert [profile.model.path(f) for f in (decode, mixed, chunk, eager)] == [
        "decode-graph", "mixed-graph", "mixed-graph", "eager"]
    price = 0.010
    assert profile.greedy_seconds(decode, "ahead", price) == pytest.approx(price - 0.4e-3 - 32 * 0.1e-3)
    assert profile.greedy_seconds(mixed, "step", price) == pytest.approx(price - 0.1e-3)
    assert profile.greedy_seconds(mixed, "ahead", price) is None
    assert profile.greedy_seconds(chunk, "step", price) is None and profile.greedy_seconds(eager, "step", price) is None
    assert profile.with_serving(profile.serving.with_greedy({})).greedy_seconds is None  # no section: asks nothing


def test_the_greedy_section_round_trips_and_is_checked():
    again = ServingModel.from_dict(ServingModel(greedy=GREEDY).to_dict())
    assert again.greedy == GREEDY
    assert "greedy" not in ServingModel().to_dict()
    with pytest.raises(ValueError, match="greedy needs exactly the keys step_saved_s, step_saved_per_sample_s, "
                                         "ahead_saved_s, ahead_saved_per_sample_s, discarded"):
        ServingModel(greedy={"step_saved_s": 1.0})
    with pytest.raises(ValueError, match=r"greedy\[ahead_saved_s\] must be a finite number >= 0"):
        ServingModel(greedy={**GREEDY, "ahead_saved_s": -1.0})
    # version 17's section priced a step ahead as a share of its price: refused, with what to do
    with pytest.raises(ValueError, match="greedy_scale .profile version 17.*--fit-greedy"):
        ServingModel.from_dict({"greedy_scale": {"step": 1.0, "ahead": 0.87, "discarded": 0.68}})


def test_fit_greedy_weighs_each_host_as_one():
    rng = np.random.default_rng(0)
    rows = []
    # host a ran many more steps (of the same batches); what the hosts' steps save lies 0.2 ms apart, 20 us a sampled
    # entry ahead, 5 us on their own
    for host, saved, n in (("a", 0.6e-3, 630), ("b", 0.8e-3, 126), ("c", 1.0e-3, 126)):
        samples = 1 + np.arange(n) % 63
        rows += [{"host": host, "kind": kind, "num_samples": int(k),
                  "saved_s": saved * share + per_sample * k + rng.normal(0, 1e-6)}
                 for kind, share, per_sample in (("ahead", 1.0, 20e-6), ("step", 0.5, 5e-6)) for k in samples]
        rows += [{"host": host, "kind": "discarded", "ratio": 0.7 + rng.normal(0, 0.001)} for _ in range(n)]
    greedy, fit = fit_greedy(rows)
    assert greedy["ahead_saved_s"] == pytest.approx(0.8e-3, abs=2e-5)
    assert greedy["ahead_saved_per_sample_s"] == pytest.approx(20e-6, abs=1e-6)
    assert greedy["step_saved_s"] == pytest.approx(0.4e-3, abs=2e-5)
    assert greedy["step_saved_per_sample_s"] == pytest.approx(5e-6, abs=1e-6)
    assert greedy["discarded"] == pytest.approx(0.7, abs=0.002)
    assert fit["ahead"]["steps"] == 882 and fit["ahead"]["hosts"] == ["a", "b", "c"] and fit["step"]["steps"] == 882
    with pytest.raises(ValueError, match="'discarded'"):
        fit_greedy([r for r in rows if r["kind"] != "discarded"])
    with pytest.raises(ValueError, match="'ahead'"):
        fit_greedy([r for r in rows if r["kind"] != "ahead"])


def test_a_negative_temperature_is_refused_with_its_flag():
    with pytest.raises(ValueError, match="--temperature must be >= 0"):
        Workload(rate=1.0, temperature=-0.5).validate()
