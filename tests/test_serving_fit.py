"""The serving section's fit (``calibration.serving``) on synthetic measurements, its older form, and how the
simulated replica charges delivery."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from calibration.profile import load_profile
from calibration.serving import (
    NOISE_QUANTILES,
    PATHS,
    PrefillHeat,
    ServingModel,
    bucket_shape,
    decode_spread_tokens,
    fit_bucket_scales,
    fit_loop,
    fit_path_growth,
    fit_path_levels,
    fit_serving,
    fit_step_knee,
    fit_step_per_sample,
    prefill_heats,
    scale_path,
    served_noise,
)
from engine.policy import BatchPlan, PassFeatures, PolicyConfig, plan_features
from sim.cluster import ClusterConfig, simulate
from sim.costs import ConstantCost, mean_noise_factor
from sim.workload import RequestTable


def synthetic(n: int = 2000, seed: int = 0):
    """Passes whose loop costs 0.1 ms + 10 us a sample; requests whose admission is 3 ms + 0.5 us a prompt token
    and whose delivery is 1 ms + 50 us per sampled entry of the pass, each with a heavy right tail."""
    rng = np.random.default_rng(seed)
    samples = rng.integers(1, 200, n)
    passes = {"path": ["decode-graph"] * n, "pass_s": np.full(n, 0.0105), "model_s": np.full(n, 0.01),
              "num_samples": samples, "serving_s": 1e-4 + 1e-5 * samples + rng.exponential(2e-5, n)}
    prompts = rng.integers(10, 4000, n)
    requests = {"prompt_tokens": prompts, "admission_s": 3e-3 + 5e-7 * prompts + rng.exponential(1e-3, n),
                "num_samples": samples, "delivery_s": 1e-3 + 5e-5 * samples + rng.exponential(2e-4, n)}
    return passes, requests


def host_passes(host: str, n: int, scale: float, per_pass_s: float, seed: int) -> dict:
    """``synthetic`` passes of one host: its steps ``scale`` x the swept model's (with 0.5% noise), its loop
    ``per_pass_s`` + 10 us a sample."""
    passes, _ = synthetic(n, seed)
    noise = np.random.default_rng(seed).normal(0, 0.005, n)
    return {**passes, "pass_s": passes["model_s"] * (scale + noise),
            "serving_s": passes["serving_s"] - 1e-4 + per_pass_s, "host": [host] * n}


def joined(*hosts: dict) -> dict:
    return {k: np.concatenate([h[k] for h in hosts]) for k in hosts[0]}


def test_delivery_grows_with_the_passs_sampled_entries():
    s = fit_serving(*synthetic())
    assert s.delivery_per_sample_s == pytest.approx(5e-5, rel=0.05)
    # the intercept carries the tail's median (2e-4 x ln 2)
    assert s.delivery_seconds(0) == pytest.approx(1e-3 + 2e-4 * np.log(2), rel=0.1)
    assert s.delivery_seconds(100) == pytest.approx(s.delivery_seconds(0) + 100 * s.delivery_per_sample_s)
    assert s.per_sample_s == pytest.approx(1e-5, rel=0.1) and s.path_scale["decode-graph"] == pytest.approx(1.05)
    assert s.admission_per_token_s == pytest.approx(5e-7, rel=0.1)
    assert ServingModel.from_dict(s.to_dict()).delivery_per_sample_s == s.delivery_per_sample_s


def test_admission_is_drawn_as_a_lightly_loaded_server_takes_requests():
    """The distribution comes from the light rows (with the flood's growth per prompt token taken out), the growth
    from the flood; too few light rows fall back on the flood, and the fit says which it used."""
    passes, flood = synthetic()
    rng = np.random.default_rng(1)
    prompts = rng.integers(10, 4000, 50)
    light = {"prompt_tokens": prompts, "admission_s": 1e-3 + 5e-7 * prompts + rng.exponential(1e-4, 50),
             "delivery_s": np.full(50, np.nan), "num_samples": np.full(50, np.nan), "light": np.full(50, True)}
    both = {k: np.concatenate([flood[k] if k in flood else np.full(len(flood["prompt_tokens"]), False), light[k]])
            for k in light}
    s = fit_serving(passes, both)
    assert s.admission_per_token_s == pytest.approx(5e-7, rel=0.1)
    assert s.fit["admission"]["source"] == "light load" and s.fit["admission"]["n"] == 50
    assert s.fit["admission"]["overload_mean_s"] == pytest.approx(np.mean(flood["admission_s"]))
    assert np.mean(s.admission_q) == pytest.approx(1e-3 + 1e-4, rel=0.15)
    assert s.delivery_per_sample_s == pytest.approx(5e-5, rel=0.05)  # light rows carry no delivery
    few = {k: v[: len(flood["prompt_tokens"]) + 5] for k, v in both.items()}
    s = fit_serving(passes, few)
    assert s.fit["admission"]["source"] == "overload" and np.mean(s.admission_q) > 3e-3


def test_a_decode_step_pays_for_its_longest_context_beyond_twice_the_mean():
    """Decode steps whose longest context exceeds twice the mean take 0.8 us a token more: the fit finds it on
    those passes alone, leaves the path's scale to the rest, and a section charges it only to such decode steps."""
    passes, requests = synthetic()
    rng = np.random.default_rng(2)
    n = len(passes["pass_s"])
    spread = np.where(rng.random(n) < 0.3, rng.uniform(100, 3000, n), 0.0)
    passes = {**passes, "spread_tokens": spread, "pass_s": passes["pass_s"] + 8e-7 * spread}
    s = fit_serving(passes, requests)
    assert s.decode_spread_s == pytest.approx(8e-7, rel=0.02)
    assert s.path_scale["decode-graph"] == pytest.approx(1.05, rel=0.01)
    assert ServingModel.from_dict(s.to_dict()).decode_spread_s == s.decode_spread_s
    assert fit_serving(synthetic()[0], requests).decode_spread_s == 0  # no spread in the runs: no term

    def features(contexts, chunk=0):
        plan = BatchPlan(num_new_tokens=[1] * len(contexts) + ([chunk] if chunk else []),
                         start_positions=[c - 1 for c in contexts] + ([0] if chunk else []),
                         samples=[True] * (len(contexts) + bool(chunk)), num_decodes=len(contexts),
                         num_prefill_tokens=chunk)
        return plan_features(plan)

    skewed, even = features([100] * 7 + [3000]), features([462] * 4 + [463] * 4)
    assert skewed.decode_max_context == 3000 and even.decode_max_context == 463
    assert skewed.decode_context == even.decode_context == 3700
    assert s.spread_seconds(skewed) == pytest.approx(s.decode_spread_s * (3000 - 2 * 3700 / 8))
    assert s.spread_seconds(even) == 0 and s.mixed_spread_s == 0
    assert s.spread_seconds(features([100] * 7 + [3000], chunk=64)) == 0  # no spread fitted beside prompt tokens
    assert decode_spread_tokens(0, 0, 0) == 0
    profile = load_profile("llama-2-7b-h200").with_serving(s)  # the simulator's replicas ask the profile
    unknown = skewed._replace(decode_max_context=0)  # older records: not known, no charge
    assert profile.predict(skewed) - profile.predict(unknown) == pytest.approx(s.spread_seconds(skewed))


def test_decodes_beside_a_chunk_pay_for_their_spread_at_a_price_of_their_own():
    """Passes with prompt tokens whose decodes' longest context exceeds twice the mean take 0.4 us a token more, decode
    steps 0.8: each price is fitted on its own passes, the path's scale on the rest, and a section charges each pass
    its kind's price; a section of an older version (no ``mixed_spread_s``) charges mixed passes nothing."""
    passes, requests = synthetic()
    rng = np.random.default_rng(3)
    n = len(passes["pass_s"])
    mixed = np.arange(n) % 2 == 1
    passes["path"] = np.where(mixed, "mixed-graph", "decode-graph")
    spread = np.where(rng.random(n) < 0.3, rng.uniform(100, 3000, n), 0.0)
    price = np.where(mixed, 4e-7, 8e-7)
    passes = {**passes, "spread_tokens": spread, "prefill_tokens": np.where(mixed, 512, 0),
              "pass_s": passes["pass_s"] + price * spread}
    s = fit_serving(passes, requests)
    assert s.decode_spread_s == pytest.approx(8e-7, rel=0.02) and s.mixed_spread_s == pytest.approx(4e-7, rel=0.02)
    assert s.fit["mixed_spread"]["n"] == int(np.sum(mixed & (spread > 0)))
    assert s.path_scale["mixed-graph"] == pytest.approx(1.05, rel=0.01)
    assert ServingModel.from_dict(s.to_dict()).mixed_spread_s == s.mixed_spread_s
    plan = BatchPlan(num_new_tokens=[1] * 8 + [64], start_positions=[99] * 7 + [2999, 0], samples=[True] * 9,
                     num_decodes=8, num_prefill_tokens=64)
    beside_chunk = plan_features(plan)
    assert s.spread_seconds(beside_chunk) == pytest.approx(4e-7 * (3000 - 2 * 3700 / 8))
    older = {k: v for k, v in s.to_dict().items() if k != "mixed_spread_s"}
    assert ServingModel.from_dict(older).spread_seconds(beside_chunk) == 0


def test_one_pass_size_fits_the_level_alone():
    passes, requests = synthetic()
    requests["num_samples"] = np.full(len(requests["num_samples"]), 7)
    s = fit_serving(passes, requests)
    assert s.delivery_per_sample_s == 0 and s.delivery_seconds(0) == pytest.approx(
        np.median(requests["delivery_s"]))


def test_a_section_of_an_older_profile_delivers_at_its_median():
    older = {"per_pass_s": 1e-4, "per_sample_s": 1e-5, "admission_per_token_s": 0.0, "admission_q": [0.003],
             "delivery_q": [0.0025], "path_scale": {}, "fit": {}}  # profile version 3-4: no per-sample term
    s = ServingModel.from_dict(older)
    assert s.delivery_seconds(1) == s.delivery_seconds(300) == 0.0025
    with pytest.raises(ValueError, match="delivery_per_sample_s"):
        ServingModel.from_dict({**older, "delivery_per_sample_s": -1.0})


def test_the_served_spread_is_each_runs_over_its_median_with_hosts_weighing_as_one():
    """A slow run's level is not spread; a host of many passes weighs no more than one of few."""
    rng = np.random.default_rng(5)
    wide = np.exp(rng.normal(0.0, 0.05, 20000))  # host a: many passes, a wide spread, in a run 10% slow and one not
    narrow = np.exp(rng.normal(0.0, 0.01, 500))  # host b: few passes, a narrow spread
    runs_a = [1.1 * wide[:10000], wide[10000:]]
    q, fit = served_noise({"a": runs_a, "b": [narrow]})
    assert len(q) == NOISE_QUANTILES and q == sorted(q) and fit["hosts"] == 2 and fit["passes"] == 20500
    assert np.median(q) == pytest.approx(1.0, abs=0.002)  # each run's level taken out
    one = lambda runs: np.array(served_noise({"x": runs})[0])  # noqa: E731
    assert np.array(q) == pytest.approx((one(runs_a) + one([narrow])) / 2, abs=2e-5)  # the hosts' mean quantile
    assert one(runs_a) == pytest.approx(one([wide]), abs=2e-3)  # the slow run's 10% is level, not spread
    assert fit["host_means"]["a"] > fit["host_means"]["b"] and fit["p90"] < one([wide])[int(0.9 * len(q))]
    assert served_noise({"a": [np.array([2.0, np.nan, 4.0, 3.0, -1.0])]})[0][0] == pytest.approx(2 / 3, abs=1e-3)
    with pytest.raises(ValueError, match="no traced pass"):
        served_noise({"a": [np.array([np.nan])]})


def test_a_section_may_carry_the_served_spread_and_the_simulator_draws_from_it():
    older = ServingModel(1e-4, 1e-5, 0.0, [0.003], [0.0025])
    assert not len(older.noise_q) and "noise_q" not in older.to_dict()
    served = older.with_noise([0.9, 1.0, 1.3], {"hosts": 1})
    back = ServingModel.from_dict(served.to_dict())
    assert back.noise_q.tolist() == [0.9, 1.0, 1.3] and back.fit["noise"] == {"hosts": 1}
    assert back.loop_seconds(10) == older.loop_seconds(10)  # only the spread changed
    for bad, message in (([1.0, 0.9], "sorted"), ([0.0, 1.0], "positive"), ([float("nan")], "finite")):
        with pytest.raises(ValueError, match=message):
            older.with_noise(bad)
    profile = load_profile("llama-2-7b-h200-bf16")
    u = np.array([0.0, 0.5, 0.9999])
    swept = profile.with_serving(older)
    assert swept.noise_factors(u) == [swept.noise[int(x * len(swept.noise))] for x in u]  # no served spread
    drawn = profile.with_serving(served).noise_factors(u)
    assert drawn == [0.9, 1.0, 1.3]
    assert mean_noise_factor(profile.with_serving(served)) == pytest.approx(3.2 / 3, abs=1e-3)
    assert mean_noise_factor(ConstantCost(0.01)) == 1.0


@dataclass
class PerSampleDelivery(ConstantCost):
    """Passes of 10 ms; a pass's tokens reach the client 1 ms per sampled entry after it ends."""

    def delivery_seconds(self, num_samples: int) -> float:
        return 1e-3 * num_samples


def test_the_replica_delivers_each_pass_after_its_own_sampled_entries():
    alone = RequestTable(arrivals=np.array([0.0]), prompt_tokens=np.array([5]), output_tokens=np.array([3]))
    pair = RequestTable(arrivals=np.array([0.0, 0.0]), prompt_tokens=np.array([5, 5]),
                        output_tokens=np.array([3, 3]))
    config = ClusterConfig(PerSampleDelivery(0.01), replicas=1, policy=PolicyConfig())
    one = simulate(alone, config, seed=0).requests
    two = simulate(pair, config, seed=0).requests
    assert one.ttft.tolist() == pytest.approx([0.011]) and one.e2e.tolist() == pytest.approx([0.031])
    assert two.ttft.tolist() == pytest.approx([0.012, 0.012]) and two.e2e.tolist() == pytest.approx([0.032] * 2)


def test_no_requests_to_fit_is_a_clear_error():
    """A run of closed-loop cells alone has no overload run: passes to fit the loop on, no requests."""
    passes = [{"path": "decode-graph", "pass_s": 0.01, "model_s": 0.01, "num_samples": 4, "serving_s": 1e-4}] * 20
    with pytest.raises(ValueError, match="admission needs at least 10 measurements, got 0 .*open-loop overload"):
        fit_serving(passes, [])


def test_the_heat_is_the_recent_share_of_time_in_prompt_passes():
    """Exponentially weighted (time constant tau): a stream of prompt passes heats the card towards 1, one that
    alternates them with decode steps of equal length towards about half, idling and decoding cool it."""
    heat = PrefillHeat(0.1)
    heat.add(0.0, 0.1, prefill_tokens=512)
    assert heat.at(0.1) == pytest.approx(1 - np.exp(-1))
    assert heat.at(0.2) == pytest.approx((1 - np.exp(-1)) * np.exp(-1))  # idle for one tau
    heat.add(0.2, 0.3, prefill_tokens=0)  # a decode step cools it as idling does
    assert heat.at(0.3) == pytest.approx((1 - np.exp(-1)) * np.exp(-2))
    rows = [{"start": 0.01 * i, "updated": 0.01 * (i + 1), "prefill_tokens": 256 * (i % 2)} for i in range(400)]
    heats = prefill_heats(rows, 0.1)
    assert heats[0] == 0 and np.mean(heats[200:]) == pytest.approx(0.5, abs=0.03)
    assert prefill_heats([{**r, "prefill_tokens": 64} for r in rows], 0.1)[-1] == pytest.approx(1.0, abs=1e-12)


def test_a_paths_scale_grows_with_the_heat_where_its_passes_span_it():
    """Served / swept = 0.95 + 0.1 x heat (plus noise): the fit finds the line; passes that all ran at about one
    heat leave it a constant (their median), and a slope below 0 (a hotter card never runs faster) is cut to 0."""
    passes, requests = synthetic()
    rng = np.random.default_rng(3)
    n = len(passes["pass_s"])
    heat = rng.uniform(0, 1, n)
    ratio = 0.95 + 0.1 * heat + rng.normal(0, 0.01, n)
    s = fit_serving({**passes, "heat": heat, "pass_s": ratio * passes["model_s"]}, requests)
    assert s.path_scale["decode-graph"] == pytest.approx(0.95, abs=0.005)
    assert s.heat_scale["decode-graph"] == pytest.approx(0.1, abs=0.01)
    assert s.scale("decode-graph", 0.5) == pytest.approx(1.0, abs=0.005) and s.heats
    narrow = fit_serving({**passes, "heat": 0.9 + 0.1 * heat, "pass_s": ratio * passes["model_s"]}, requests)
    assert narrow.heat_scale["decode-graph"] == 0 and not narrow.heats
    assert narrow.path_scale["decode-graph"] == pytest.approx(np.median(ratio))
    falling = fit_serving({**passes, "heat": heat, "pass_s": (2 - ratio) * passes["model_s"]}, requests)
    assert falling.heat_scale["decode-graph"] == 0
    back = ServingModel.from_dict(s.to_dict())
    assert back.heat_scale == s.heat_scale and back.heat_tau_s == s.heat_tau_s
    assert not ServingModel.from_dict({k: v for k, v in s.to_dict().items() if k != "heat_scale"}).heats  # < v8
    with pytest.raises(ValueError, match="heat_scale"):
        ServingModel.from_dict({**s.to_dict(), "heat_scale": {"decode-graph": -0.1}})


def test_a_hot_card_slows_the_simulated_passes():
    """A profile whose passes run 20% slower per unit of heat: a replica fed prompts back to back heats up and its
    requests take longer than under the same section without heat; without heat the replica keeps none."""
    profile = load_profile("llama-2-7b-h200")
    section = {**profile.serving.to_dict(), "bucket_scale": {}}  # every bucket at the path's scale
    hot = profile.with_serving(ServingModel.from_dict({**section, "heat_scale": {p: 0.2 for p in PATHS}}))
    flat = profile.with_serving(ServingModel.from_dict({**section, "heat_scale": {}}))
    assert flat.new_heat() is None and hot.new_heat().tau_s == section["heat_tau_s"]
    f = plan_features(BatchPlan(num_new_tokens=[512], start_positions=[0], samples=[True], num_prefill_tokens=512))
    assert hot.predict(f, 1.0) - hot.predict(f, 0.0) == pytest.approx(0.2 * profile.model.predict(f))
    table = RequestTable(arrivals=np.zeros(40), prompt_tokens=np.full(40, 2000), output_tokens=np.full(40, 20))
    runs = {name: simulate(table, ClusterConfig(cost, replicas=1, policy=PolicyConfig()), seed=0).requests
            for name, cost in (("hot", hot), ("flat", flat))}
    assert runs["hot"].e2e.mean() > 1.05 * runs["flat"].e2e.mean()
    again = simulate(table, ClusterConfig(hot, replicas=1, policy=PolicyConfig()), seed=0).requests
    assert again.e2e.tolist() == runs["hot"].e2e.tolist()


@pytest.mark.parametrize("base, alone, prompt", [("eager", "eager-prefill", 2000),
                                                 ("mixed-graph", "mixed-prefill", 300)])
def test_a_pass_of_prompts_alone_has_a_scale_of_its_own(base, alone, prompt):
    """From profile version 10 (eager) and 12 (mixed graph) a pass without decodes is priced at its own path's scale
    (and heat); a section from before prices it at the base path's, as it did."""
    assert [scale_path(base, 0), scale_path(base, 3), scale_path("decode-graph", 0)] == [alone, base, "decode-graph"]
    profile = load_profile("llama-2-7b-h200")
    section = {**profile.serving.to_dict(), "attention_scale": {}, "bucket_scale": {}, "sampler_saved": {}}  # as swept
    older = {**section, "path_scale": {p: v for p, v in section["path_scale"].items() if p != alone},
             "heat_scale": {p: v for p, v in section["heat_scale"].items() if p != alone}}
    before = ServingModel.from_dict(older)
    heated = ServingModel.from_dict({**older, "heat_scale": {**older["heat_scale"], base: 0.2}})
    assert before.scale(alone, 0.7) == before.scale(base, 0.7)
    assert heated.scale(alone, 0.7) == heated.scale(base, 0.7) > heated.scale(base, 0.0)
    own = profile.with_serving(ServingModel.from_dict({
        **section, "path_scale": {**section["path_scale"], alone: 0.5},
        "heat_scale": {**section["heat_scale"], alone: 0.25}}))
    by_itself = plan_features(BatchPlan(num_new_tokens=[prompt], start_positions=[0], samples=[True],
                                        num_prefill_tokens=prompt))
    beside = plan_features(BatchPlan(num_new_tokens=[1, prompt], start_positions=[300, 0], samples=[True, True],
                                     num_decodes=1, num_prefill_tokens=prompt))
    serving = own.serving
    assert own.model.path(by_itself) == own.model.path(beside) == base
    assert own.predict(by_itself, 0.4) == pytest.approx(
        (0.5 + 0.25 * 0.4) * own.model.predict(by_itself) + serving.loop_seconds(1))
    assert own.predict(beside, 0.4) == pytest.approx(
        serving.scale(base, 0.4) * own.model.predict(beside) + serving.loop_seconds(2))
    fitted = fit_serving({**synthetic()[0], "path": [alone] * 2000}, synthetic()[1])
    assert fitted.path_scale[alone] == pytest.approx(1.05) and fitted.path_scale[base] == 1.0


def test_the_loop_bends_where_its_work_per_entry_grows():
    """Served, the loop's work per sampled entry grows past a batch size that only overload runs reach: a line
    through both would over-price every pass below it."""
    passes, requests = synthetic()
    rng = np.random.default_rng(1)
    samples = rng.integers(1, 257, len(passes["num_samples"]))
    bent = 1e-4 + 8e-6 * samples + 1.2e-5 * np.maximum(0, samples - 128)
    passes = {**passes, "num_samples": samples, "serving_s": bent + rng.exponential(2e-5, len(samples))}
    s = fit_serving(passes, requests)
    assert abs(s.loop_knee - 128) <= 16
    assert s.per_sample_s == pytest.approx(8e-6, rel=0.15) and s.per_sample_above_knee_s == pytest.approx(
        1.2e-5, rel=0.2)
    for n in (10, 100, 250):  # the tail's median rides on the line
        assert s.loop_seconds(n) == pytest.approx(1e-4 + 8e-6 * n + 1.2e-5 * max(0, n - 128), abs=3e-5)
    assert ServingModel.from_dict(s.to_dict()).loop_seconds(250) == s.loop_seconds(250)
    straight = fit_serving(*synthetic())  # no bend in the passes: (nearly) none in the fit
    assert straight.loop_seconds(199) - straight.loop_seconds(100) == pytest.approx(99 * 1e-5, rel=0.1)


def test_a_section_without_a_knee_prices_the_loop_on_one_line():
    older = {"per_pass_s": 1e-4, "per_sample_s": 1e-5, "admission_per_token_s": 0.0, "admission_q": [0.003],
             "delivery_q": [0.0025], "path_scale": {}, "fit": {}}  # profile versions before 9
    s = ServingModel.from_dict(older)
    assert s.loop_seconds(300) == pytest.approx(1e-4 + 300 * 1e-5)
    with pytest.raises(ValueError, match="loop_knee"):
        ServingModel.from_dict({**older, "loop_knee": -1})


def test_each_host_weighs_as_one_in_a_paths_scale():
    """A host with ten times the passes of two others, its steps 10% slower than the model: pooled by pass, the
    path's scale is that host's; by host, the median host's. A host with too few passes of the path is left out."""
    requests = synthetic()[1]
    slow, fast, mid = (host_passes("slow", 4000, 1.10, 1e-4, 1), host_passes("fast", 400, 1.00, 1e-4, 2),
                       host_passes("mid", 400, 1.02, 1e-4, 3))
    passes = joined(slow, fast, mid, host_passes("few", 5, 2.0, 1e-4, 4))
    s = fit_serving(passes, requests)
    assert s.path_scale["decode-graph"] == pytest.approx(1.02, abs=0.005)
    summary = s.fit["path_scale"]["decode-graph"]
    assert summary["n"] == 4800 and summary["hosts"] == 3
    assert summary["host_levels"] == pytest.approx({"slow": 1.10, "fast": 1.00, "mid": 1.02}, abs=0.005)
    by_pass = fit_serving({k: v for k, v in passes.items() if k != "host"}, requests)
    assert by_pass.path_scale["decode-graph"] == pytest.approx(1.10, abs=0.005)
    assert fit_serving(joined(slow, fast), requests).path_scale["decode-graph"] == pytest.approx(1.05, abs=0.005)


def test_hosts_that_span_the_heat_set_its_growth_and_every_host_its_level():
    """Two hosts whose passes span the heat (served / swept = 0.85 + 0.14 x heat, one host 2% slower) and two that
    ran hot only, on the same line: the growth is the spanning hosts', and the level the median of all four (a
    median of separate lines would take the hot hosts' flat lines as growth 0, and halve it)."""
    requests = synthetic()[1]
    rng = np.random.default_rng(5)

    def host(name: str, n: int, heat_low: float, offset: float) -> dict:
        heat = rng.uniform(heat_low, 1.0, n)
        rows = host_passes(name, n, 1.0, 1e-4, int(100 * heat_low) + len(name))
        return {**rows, "heat": heat, "pass_s": (0.85 + offset + 0.14 * heat) * rows["model_s"]}

    passes = joined(host("cool", 600, 0.0, 0.0), host("cooler", 600, 0.0, 0.02),
                    host("hot", 3000, 0.9, 0.005), host("hotter", 3000, 0.95, 0.01))
    s = fit_serving(passes, requests)
    assert s.heat_scale["decode-graph"] == pytest.approx(0.14, abs=0.005)
    assert s.path_scale["decode-graph"] == pytest.approx(0.8575, abs=0.003)
    assert s.fit["path_scale"]["decode-graph"]["host_levels"]["hot"] == pytest.approx(0.855, abs=0.003)


def test_a_paths_level_moves_to_the_median_host_and_keeps_its_heat_growth():
    """Three hosts ran prompts alone at served / swept = level + 0.1 x heat, levels 0.95, 0.98 and 1.10 (the last
    with ten times the passes): the path's level is the median host's, read at the section's growth, which stays;
    so do the paths not asked for. Decode steps of over 128 sequences, hotter than any cell's, are left out."""
    rng = np.random.default_rng(8)
    section = ServingModel(path_scale={"mixed-prefill": 0.90, "decode-graph": 1.0},
                           heat_scale={"mixed-prefill": 0.1, "decode-graph": 0.05})

    def host(name: str, n: int, level: float, path: str = "mixed-prefill", samples: int = 4) -> dict:
        heat = rng.uniform(0, 1, n)
        return {"path": [path] * n, "model_s": np.full(n, 0.02), "heat": heat, "host": [name] * n,
                "pass_s": 0.02 * (level + 0.1 * heat + rng.normal(0, 0.003, n)), "num_samples": np.full(n, samples),
                "prefill_tokens": np.full(n, 512 if path == "mixed-prefill" else 0)}

    passes = joined(host("a", 200, 0.95), host("b", 200, 0.98), host("c", 2000, 1.10),
                    host("a", 300, 1.01, "decode-graph"), host("a", 300, 1.30, "decode-graph", samples=200))
    levels, fit = fit_path_levels(passes, section, ["mixed-prefill"])
    assert levels == {"mixed-prefill": pytest.approx(0.98, abs=0.003)}
    assert fit["mixed-prefill"]["hosts"] == 3 and fit["mixed-prefill"]["before"] == 0.90
    moved = section.with_path_levels(levels, fit)
    assert moved.path_scale["mixed-prefill"] == levels["mixed-prefill"] and moved.path_scale["decode-graph"] == 1.0
    assert moved.heat_scale == section.heat_scale and moved.fit["levels"] == fit
    # decode steps grew at 0.1 a unit of heat, the section prices 0.05: its level reads the rest at the median heat
    assert fit_path_levels(passes, section)[0]["decode-graph"] == pytest.approx(1.01 + 0.05 * 0.5, abs=0.01)
    with pytest.raises(ValueError, match="unknown serving path 'prefill'"):
        fit_path_levels(passes, section, ["prefill"])
    with pytest.raises(ValueError, match="no path has 10 passes"):
        fit_path_levels(passes, section, ["eager"])


def test_a_paths_growth_is_the_median_hosts_and_its_level_follows():
    """Three hosts ran mixed passes at served / swept = (level + 0.08 x heat) x (1 + 0.3 x attention's share of
    the step), levels 0.90, 0.92 and 1.05: the path's attention scale and heat growth are the hosts' medians, and
    its level, fitted at them, the median host's. Decode steps that span no heat keep the section's growth, and
    have no attention to grow; prompts alone, all on a cool card, take their base path's growth and attention."""
    rng = np.random.default_rng(9)
    section = ServingModel(path_scale={"mixed-graph": 1.0, "decode-graph": 0.97},
                           heat_scale={"decode-graph": 0.02})

    def host(name: str, n: int, level: float) -> dict:
        heat, share = rng.uniform(0, 1, n), rng.uniform(0, 0.2, n)
        served = 0.02 * (level + 0.08 * heat) * (1 + 0.3 * share) * (1 + rng.normal(0, 0.002, n))
        return {"path": ["mixed-graph"] * n, "model_s": np.full(n, 0.02), "attention_s": 0.02 * share,
                "heat": heat, "host": [name] * n, "pass_s": served, "num_samples": np.full(n, 8),
                "prefill_tokens": np.full(n, 512)}

    decodes = {"path": ["decode-graph"] * 50, "model_s": np.full(50, 0.01), "attention_s": np.zeros(50),
               "heat": np.full(50, 0.5), "host": ["a"] * 50, "pass_s": np.full(50, 0.0099),
               "num_samples": np.full(50, 16), "prefill_tokens": np.zeros(50)}
    alone = {**decodes, "path": ["mixed-prefill"] * 50, "heat": rng.uniform(0, 0.05, 50),
             "prefill_tokens": np.full(50, 512)}
    passes = joined(host("a", 400, 0.90), host("b", 400, 0.92), host("c", 4000, 1.05), decodes, alone)
    attention, heat, fit = fit_path_growth(passes, section)
    assert attention == {"mixed-graph": pytest.approx(0.3, abs=0.02), "decode-graph": 0.0,
                         "mixed-prefill": attention["mixed-graph"]}
    assert heat == {"mixed-graph": pytest.approx(0.08, abs=0.01), "decode-graph": 0.02,
                    "mixed-prefill": heat["mixed-graph"]}
    assert fit["mixed-graph"]["heat_hosts"] == 3 and fit["decode-graph"]["heat_hosts"] == 0
    assert fit["mixed-prefill"]["heat_from"] == "mixed-graph" and "heat_from" not in fit["decode-graph"]
    assert fit["mixed-prefill"]["attention_from"] == "mixed-graph"
    grown = section.with_path_growth(attention, heat, fit)
    assert grown.fit["growth"] == fit and grown.path_scale == section.path_scale
    levels, _ = fit_path_levels(passes, grown, ["mixed-graph"])
    assert levels == {"mixed-graph": pytest.approx(0.92, abs=0.01)}
    with pytest.raises(ValueError, match="no path has 10 passes on a host to fit its growth"):
        fit_path_growth(passes, section, ["eager"])


def test_a_paths_heat_growth_alone_keeps_the_sections_attention():
    """Without attention, the growth fit keeps the section's attention scales (the path's and its prompts alone's,
    which then do not take their base path's) and reads the heat growth at them: three hosts served mixed passes at
    (0.9 + 0.08 x heat) x (1 + 0.3 x attention's share), the share drawn apart from the heat, so the growth is the
    same either way and the attention fitted only where asked for."""
    rng = np.random.default_rng(5)
    section = ServingModel(path_scale={"mixed-graph": 0.9, "mixed-prefill": 0.9},
                           attention_scale={"mixed-graph": 0.1, "mixed-prefill": 0.05})

    def host(name: str, n: int) -> dict:
        heat, share = rng.uniform(0, 1, n), rng.uniform(0, 0.2, n)
        served = 0.02 * (0.9 + 0.08 * heat) * (1 + 0.3 * share) * (1 + rng.normal(0, 0.002, n))
        return {"path": ["mixed-graph"] * n, "model_s": np.full(n, 0.02), "attention_s": 0.02 * share,
                "heat": heat, "host": [name] * n, "pass_s": served, "num_samples": np.full(n, 8),
                "prefill_tokens": np.full(n, 512)}

    alone = {"path": ["mixed-prefill"] * 50, "model_s": np.full(50, 0.01), "attention_s": np.zeros(50),
             "heat": rng.uniform(0, 0.05, 50), "host": ["a"] * 50, "pass_s": np.full(50, 0.0091),
             "num_samples": np.full(50, 1), "prefill_tokens": np.full(50, 512)}
    passes = joined(host("a", 300), host("b", 300), host("c", 300), alone)
    kept, heat, fit = fit_path_growth(passes, section, attention=False)
    assert kept == {"mixed-graph": 0.1, "mixed-prefill": 0.05}
    assert heat["mixed-graph"] == pytest.approx(0.08, abs=0.015) and heat["mixed-prefill"] == heat["mixed-graph"]
    assert fit["mixed-graph"]["attention_kept"] and "attention_from" not in fit["mixed-prefill"]
    fitted, heat_with, fit_with = fit_path_growth(passes, section)
    assert fitted["mixed-graph"] == pytest.approx(0.3, abs=0.03) and fitted["mixed-prefill"] == fitted["mixed-graph"]
    assert heat_with["mixed-graph"] == pytest.approx(heat["mixed-graph"], abs=0.015)
    assert "attention_kept" not in fit_with["mixed-graph"]


def test_attention_on_a_cool_card_with_passes_timed_apart_from_their_work():
    """Ten to twenty passes a host on a cool card (heat 0-0.05), served at (0.93 + 0.1 x heat) x (1 + 0.3 x share),
    and on each a pass that ended before its GPU work and the one that took the rest (ratios 0.13 and 2.6, as an
    engine's first prompt chunks are timed): the heat cannot be told from the level there, and the two passes pull
    a plain least-squares line far off (scales of 7-25 on such runs); the fit still reads the attention."""
    rng = np.random.default_rng(11)
    section = ServingModel(path_scale={"mixed-graph": 0.93})

    def host(name: str, n: int) -> dict:
        heat, share = rng.uniform(0, 0.05, n), rng.uniform(0.02, 0.16, n)
        served = 0.02 * (0.93 + 0.1 * heat) * (1 + 0.3 * share) * (1 + rng.normal(0, 0.005, n))
        served[:2] = 0.02 * np.array([0.13, 2.6])
        return {"path": ["mixed-graph"] * n, "model_s": np.full(n, 0.02), "attention_s": 0.02 * share,
                "heat": heat, "host": [name] * n, "pass_s": served, "num_samples": np.full(n, 1),
                "prefill_tokens": np.full(n, 768)}

    attention, heat, _ = fit_path_growth(joined(host("a", 12), host("b", 15), host("c", 20)), section)
    assert attention["mixed-graph"] == pytest.approx(0.3, abs=0.1)
    assert heat["mixed-graph"] == 0.0  # spans too little heat to grow with it


def test_the_served_steps_work_per_sampled_entry_and_the_levels_beneath_it():
    """Three hosts served graph passes at level x swept step + b x sampled entries (decode 0.97 and mixed 0.93, b
    6, 8 and 11 us), small batches and large: one level per path would price a small batch too dear and a large one
    too cheap. The fit reads b as the hosts' median and the levels beneath it; the price grows by it on the graph
    paths only, and the section keeps it through its dict."""
    rng = np.random.default_rng(5)
    section = ServingModel(path_scale={"decode-graph": 0.99, "mixed-graph": 0.95})

    def host(name: str, b: float) -> dict:
        n = 600
        path = np.where(rng.uniform(size=n) < 0.7, "decode-graph", "mixed-graph")
        samples = rng.integers(1, 129, n)
        swept = 0.005 + 4e-5 * samples + np.where(path == "mixed-graph", 0.01, 0.0)
        level = np.where(path == "decode-graph", 0.97, 0.93)
        served = (level * swept + b * samples) * (1 + rng.normal(0, 0.004, n))
        served[:3] *= np.array([0.2, 3.0, 2.0])  # passes timed apart from their work
        return {"path": path, "model_s": swept, "attention_s": np.zeros(n), "heat": np.zeros(n),
                "host": [name] * n, "pass_s": served, "num_samples": samples, "prefill_tokens": np.zeros(n)}

    passes = joined(host("a", 6e-6), host("b", 8e-6), host("c", 11e-6))
    b, fit = fit_step_per_sample(passes, section)
    assert b == pytest.approx(8e-6, rel=0.1)
    assert fit["hosts"]["c"]["per_sample_s"] == pytest.approx(11e-6, rel=0.1) and fit["before"] == 0.0
    grown = section.with_step_per_sample(b, fit)
    levels, _ = fit_path_levels(passes, grown)
    # each host's median ratio after its own b less the median b: the median host's levels
    assert levels == {"decode-graph": pytest.approx(0.97, abs=0.01), "mixed-graph": pytest.approx(0.93, abs=0.01)}
    priced = grown.with_path_levels(levels)
    assert priced.step_seconds("decode-graph", 0.01, 100) == pytest.approx(levels["decode-graph"] * 0.01 + 100 * b)
    assert priced.step_seconds("eager", 0.01, 100) == pytest.approx(priced.path_scale["eager"] * 0.01)
    assert ServingModel.from_dict(priced.to_dict()).step_per_sample_s == b
    with pytest.raises(ValueError, match="no host has 10 passes that sample on a graph path"):
        fit_step_per_sample(passes, section, ["eager"])


def test_a_graph_step_past_the_knee_saves_what_the_hosts_show():
    """Three hosts served graph steps on their price up to 128 sampled entries and past it under it, decode steps by
    0.9-1.1 ms + 2 us an entry beyond, mixed passes by 0.4 ms + 16-22 us; greedy passes (which skip the sampling)
    and steps over contexts of different lengths ran on their price and stay out. The fit reads each path's two
    numbers as the hosts' medians; the price drops by them past the knee on the graph paths only, never below 0,
    and the section keeps them through its dict (a section without them keeps the older form)."""
    rng = np.random.default_rng(7)
    section = ServingModel(path_scale={"decode-graph": 0.99, "mixed-graph": 0.9}, step_per_sample_s=5e-6)
    truth = {"a": {"decode-graph": (0.9e-3, 2e-6), "mixed-graph": (0.4e-3, 16e-6)},
             "b": {"decode-graph": (1.0e-3, 1.5e-6), "mixed-graph": (0.35e-3, 19e-6)},
             "c": {"decode-graph": (1.1e-3, 2.5e-6), "mixed-graph": (0.45e-3, 22e-6)}}

    def host(name: str) -> dict:
        n = 800
        path = np.where(rng.uniform(size=n) < 0.5, "decode-graph", "mixed-graph")
        samples = rng.integers(1, 257, n)
        swept = 0.006 + 4e-5 * samples + np.where(path == "mixed-graph", 0.012, 0.0)
        priced = np.array([section.step_seconds(p, s, int(k)) for p, s, k in zip(path, swept, samples)])
        saved = np.array([truth[name][p][0] + truth[name][p][1] * (k - 128) if k > 128 else 0.0
                          for p, k in zip(path, samples)])
        greedy, spread = rng.uniform(size=n) < 0.1, rng.uniform(size=n) < 0.1
        served = np.where(greedy | spread, priced, priced - saved) * (1 + rng.normal(0, 0.003, n))
        served[:2] *= np.array([0.3, 2.5])  # passes timed apart from their work
        return {"path": path, "model_s": swept, "attention_s": np.zeros(n), "heat": np.zeros(n), "host": [name] * n,
                "pass_s": served, "num_samples": samples, "greedy": greedy, "spread_tokens": 300.0 * spread}

    passes = joined(host("a"), host("b"), host("c"))
    saved, fit = fit_step_knee(passes, section)
    assert saved["decode-graph"] == {"saved_s": pytest.approx(1.0e-3, rel=0.05),
                                     "per_sample_s": pytest.approx(2e-6, abs=3e-7)}
    assert saved["mixed-graph"] == {"saved_s": pytest.approx(0.4e-3, rel=0.15),
                                    "per_sample_s": pytest.approx(19e-6, rel=0.05)}
    assert fit["knee"] == 128 and fit["hosts"]["mixed-graph"]["c"]["per_sample_s"] == pytest.approx(22e-6, rel=0.05)
    kneed = section.with_step_knee(128, saved, fit)
    plain = section.step_seconds("mixed-graph", 0.02, 200)
    assert kneed.step_seconds("mixed-graph", 0.02, 128) == section.step_seconds("mixed-graph", 0.02, 128)
    assert kneed.step_seconds("mixed-graph", 0.02, 200) == pytest.approx(
        plain - saved["mixed-graph"]["saved_s"] - 72 * saved["mixed-graph"]["per_sample_s"])
    assert kneed.step_seconds("eager", 0.02, 200) == section.step_seconds("eager", 0.02, 200)
    dear = ServingModel(step_knee=1, step_saved_past_knee={"decode-graph": {"saved_s": 1.0, "per_sample_s": 0.0}})
    assert dear.step_seconds("decode-graph", 0.01, 2) == 0.0
    # a level fit on steps served at the kneed price gives the saving back first: the levels stay where they are
    steps = {k: v for k, v in passes.items() if k not in ("greedy", "spread_tokens")}
    steps["pass_s"] = np.array([kneed.step_seconds(p, m, int(n)) for p, m, n
                                in zip(steps["path"], steps["model_s"], steps["num_samples"])])
    steps["prefill_tokens"] = np.where(steps["path"] == "mixed-graph", 512.0, 0.0)
    levels, _ = fit_path_levels(steps, kneed)
    assert levels == {p: pytest.approx(kneed.path_scale[p]) for p in ("decode-graph", "mixed-graph")}
    assert fit_path_levels(steps, section)[0]["mixed-graph"] < section.path_scale["mixed-graph"] - 0.005
    again = ServingModel.from_dict(kneed.to_dict())
    assert again.step_knee == 128 and again.step_saved_past_knee == kneed.step_saved_past_knee
    assert "step_knee" not in section.to_dict() and "step_saved_past_knee" not in section.to_dict()
    with pytest.raises(ValueError, match="no host has 10 passes past 300 sampled entries"):
        fit_step_knee(passes, section, knee=300)
    with pytest.raises(ValueError, match="knee must be a number of sampled entries >= 1"):
        fit_step_knee(passes, section, knee=0)


@pytest.mark.parametrize("change, message", [
    ({"step_saved_past_knee": {"eager": {"saved_s": 1e-3, "per_sample_s": 0.0}}}, "not a graph path"),
    ({"step_saved_past_knee": {"decode-graph": {"saved_s": 1e-3}}}, "needs exactly the keys saved_s, per_sample_s"),
    ({"step_saved_past_knee": {"decode-graph": {"saved_s": -1e-3, "per_sample_s": 0.0}}},
     r"step_saved_past_knee\[decode-graph\].saved_s must be a finite number >= 0"),
    ({"step_knee": 0.0}, "needs a step_knee > 0"),
    ({"step_knee": -1.0}, "step_knee must be a finite number >= 0"),
])
def test_a_bad_knee_in_the_step_is_refused_by_name(change, message):
    d = {"step_knee": 128.0, "step_saved_past_knee": {"decode-graph": {"saved_s": 1e-3, "per_sample_s": 1e-6}}}
    with pytest.raises(ValueError, match=message):
        ServingModel.from_dict({**d, **change})


def test_each_host_weighs_as_one_in_the_loop():
    """Each bin of the loop's fit takes the median of its hosts' medians: a host with ten times the passes of two
    others and a loop 0.2 ms slower a pass does not move the line off the median host's."""
    passes = joined(host_passes("busy", 4000, 1.05, 3e-4, 1), host_passes("a", 400, 1.05, 1e-4, 2),
                    host_passes("b", 400, 1.05, 1.2e-4, 3))
    s = fit_serving(passes, synthetic()[1])
    tail = 2e-5 * np.log(2)  # the median of each pass's exponential tail
    assert s.per_pass_s == pytest.approx(1.2e-4 + tail, abs=1e-5) and s.per_sample_s == pytest.approx(1e-5, rel=0.1)
    assert s.fit["loop"]["hosts"] == 3 and s.fit["loop"]["n"] == 4800
    assert fit_serving({k: v for k, v in passes.items() if k != "host"}, synthetic()[1]).per_pass_s > 2.5e-4


def test_the_loop_leaves_out_bins_that_few_hosts_reach():
    """Three hosts on one line up to 95 sampled entries; one of them also ran a few batches of 200-250, whose loop
    grew 80 us more an entry past 200: bins only it has are left out (fewer than half the hosts have them), so the
    line does not bend there, as that host's own fit does."""
    rng = np.random.default_rng(7)
    rows = {"num_samples": [], "serving_s": [], "host": []}
    for host in ("a", "b", "c"):
        samples = rng.integers(1, 96, 600)
        if host == "a":
            samples = np.concatenate([samples, rng.integers(200, 251, 40)])
        loop = 1e-4 + 8e-6 * samples + 8e-5 * np.maximum(0, samples - 199)
        rows["num_samples"] += samples.tolist()
        rows["serving_s"] += loop.tolist()
        rows["host"] += [host] * len(samples)
    per_pass, per_sample, knee, above, summary = fit_loop(rows)
    assert (per_pass, per_sample, above) == pytest.approx((1e-4, 8e-6, 0.0), abs=1e-7)
    assert summary["bins"] == 6 and summary["hosts"] == 3
    alone = fit_loop({k: [v for v, h in zip(rows[k], rows["host"]) if h == "a"] for k in rows})
    assert alone[3] > 1e-5  # the one host's own fit bends at its largest batches


def test_a_loop_knee_needs_two_bins_past_it():
    """One host on a line up to 111 sampled entries and a few passes of 113 that took twice as long: a knee at 112,
    with that one bin past it, would fit it at any slope (a millisecond an entry here); the knee comes at least a
    bin earlier, so the slope past it stays within the bin's step over the entries it spans."""
    samples = np.concatenate([np.arange(1, 112).repeat(20), np.full(8, 113)])
    loop = 1e-4 + 8e-6 * samples
    loop[samples == 113] *= 2
    per_pass, per_sample, knee, above, summary = fit_loop({"num_samples": samples, "serving_s": loop})
    assert summary["bins"] == 8 and knee <= 96 and above < 1e-3 / 16


def test_one_host_fits_as_passes_without_hosts_do():
    passes = {k: v for k, v in joined(host_passes("slow", 400, 1.10, 3e-4, 1),
                                      host_passes("fast", 400, 1.00, 1e-4, 2)).items() if k != "host"}
    requests = synthetic()[1]
    one_host = {**passes, "host": ["h"] * len(passes["pass_s"])}
    assert fit_serving(one_host, requests).to_dict() == fit_serving(passes, requests).to_dict()


def test_a_paths_scale_grows_with_its_passes_share_of_prompt_attention():
    """Two hosts (one 3% slower) whose served steps are 0.9 x (1 + 0.1 x heat) x (swept + 0.3 x swept attention):
    the fit finds the attention scale 0.3 and the level and heat of what is left; passes that span too little of
    attention's share, or carry none, leave the path without one."""
    rng = np.random.default_rng(5)
    hosts = []
    for host, speed in (("a", 1.0), ("b", 1.03)):
        passes, requests = synthetic(3000, seed=len(hosts))
        n = len(passes["model_s"])
        share, heat = rng.uniform(0.0, 0.3, n), rng.uniform(0, 1, n)
        attention = share * passes["model_s"]
        pass_s = speed * 0.9 * (1 + 0.1 * heat) * (passes["model_s"] + 0.3 * attention) * rng.normal(1, 0.005, n)
        hosts.append({**passes, "path": ["mixed-graph"] * n, "heat": heat, "attention_s": attention,
                      "pass_s": pass_s, "host": [host] * n})
    s = fit_serving(joined(*hosts), requests)
    assert s.attention_scale["mixed-graph"] == pytest.approx(0.3, abs=0.02)
    assert s.path_scale["mixed-graph"] == pytest.approx(0.9 * 1.015, abs=0.01)
    assert s.heat_scale["mixed-graph"] == pytest.approx(0.09 * 1.015, abs=0.01)
    narrow = joined(*[{**h, "attention_s": 0.1 * h["model_s"]} for h in hosts])
    assert fit_serving(narrow, requests).attention_scale["mixed-graph"] == 0.0
    back = ServingModel.from_dict(s.to_dict())
    assert back.attention_scale == s.attention_scale
    older = ServingModel.from_dict({k: v for k, v in s.to_dict().items() if k != "attention_scale"})  # < v13
    assert set(older.attention_scale.values()) == {0.0}
    with pytest.raises(ValueError, match="attention_scale"):
        ServingModel.from_dict({**s.to_dict(), "attention_scale": {"graph": 0.1}})


def test_a_chunk_on_a_deep_prefix_is_priced_with_its_attention_grown():
    """Served, a pass costs scale x (swept + attention_scale x its swept prefix attention): a chunk on a deep prefix
    grows by more than a prompt alone of the same tokens, and a decode step not at all."""
    profile = load_profile("llama-2-7b-h200")
    section = {**profile.serving.to_dict(), "bucket_scale": {}}  # every bucket at the path's scale
    grown = profile.with_serving(ServingModel.from_dict(
        {**section, "attention_scale": {"mixed-graph": 0.3, "mixed-prefill": 0.3}}))
    flat = profile.with_serving(ServingModel.from_dict({**section, "attention_scale": {}}))
    deep = plan_features(BatchPlan(num_new_tokens=[1, 512], start_positions=[300, 3000], samples=[True, False],
                                   num_decodes=1, num_prefill_tokens=512))
    alone = plan_features(BatchPlan(num_new_tokens=[1, 512], start_positions=[300, 0], samples=[True, True],
                                    num_decodes=1, num_prefill_tokens=512))
    decode = plan_features(BatchPlan(num_new_tokens=[1, 1], start_positions=[300, 900], samples=[True, True],
                                     num_decodes=2))
    for f in (deep, alone):
        assert grown.predict(f, 0.5) - flat.predict(f, 0.5) == pytest.approx(
            0.3 * flat.serving.scale("mixed-graph", 0.5) * profile.attention_seconds(f))
    assert profile.attention_seconds(deep) > 3 * profile.attention_seconds(alone) > 0
    assert profile.attention_seconds(decode) == 0 and grown.predict(decode) == flat.predict(decode)


def test_a_mixed_pass_is_priced_by_its_graph_bucket():
    """Two hosts at mixed-graph levels 0.90 and 1.00 ran passes of the 768-token bucket on their level and those of
    the 256 bucket 8% over it (one rarer bucket, 512, on one host only): each bucket's factor is over the host's own
    median, so the levels keep their meaning and a bucket seen on fewer than 10 passes of a host gets none. The price
    of a pass in a bucket grows by its factor, other buckets and paths keep theirs, and the section keeps the factors
    through its dict (JSON keys)."""
    rng = np.random.default_rng(11)
    section = ServingModel(path_scale={"mixed-graph": 0.95, "mixed-prefill": 0.97})

    def host(name: str, level: float, extra: tuple = ()) -> dict:
        buckets = np.array([768] * 300 + [256] * 60 + list(extra))
        n = len(buckets)
        swept = np.where(buckets == 768, 0.02, 0.008)
        served = level * swept * np.where(buckets == 256, 1.08, 1.0) * (1 + rng.normal(0, 0.003, n))
        return {"path": ["mixed-graph"] * n, "model_s": swept, "attention_s": np.zeros(n), "heat": np.zeros(n),
                "host": [name] * n, "pass_s": served, "num_samples": np.full(n, 4), "prefill_tokens": np.full(n, 200),
                "bucket": buckets}

    passes = joined(host("a", 0.90, (512,) * 12), host("b", 1.00, (512,) * 5))
    scales, fit = fit_bucket_scales(passes, section)
    assert scales == {"mixed-graph": {256: pytest.approx(1.08, abs=0.005), 512: pytest.approx(1.0, abs=0.03),
                                      768: pytest.approx(1.0, abs=0.005)}}
    assert fit["mixed-graph"]["hosts"] == 2 and fit["mixed-graph"]["bucket_hosts"] == {"256": 2, "512": 1, "768": 2}
    priced = ServingModel.from_dict(section.with_bucket_scale(scales, fit).to_dict())
    assert priced.bucket_scale == scales and priced.fit["buckets"] == fit
    assert priced.step_seconds("mixed-graph", 0.01, 4, bucket=256) == pytest.approx(0.95 * scales["mixed-graph"][256]
                                                                                  * 0.01)
    assert priced.step_seconds("mixed-graph", 0.01, 4, bucket=128) == pytest.approx(0.95 * 0.01)
    assert priced.step_seconds("mixed-prefill", 0.01, 0, bucket=256) == pytest.approx(0.97 * 0.01)
    # rows of several passes (bucket 0) and other paths do not count
    with pytest.raises(ValueError, match="no mixed-graph path has 10 passes of a bucket"):
        fit_bucket_scales({**passes, "bucket": np.zeros(len(passes["bucket"]))}, section)


def test_hosts_that_served_other_budgets_share_one_bucket_shape():
    """Passes of the 512-token bucket run 4% over those of the 768 one, of the 256 one 8%. Host a served budget
    768 (its typical pass in the 768 bucket), host b budget 512 (most passes there), host c both, at levels 0.9, 1.0
    and 1.05: over each host's own median b's factors would read 512 at 1 and 768 under it, but the shape is split
    from the host offsets, and scaled so that the median host's typical pass keeps its price under the section's
    factors (here 768 at 0.99, the rest unpriced)."""
    rng = np.random.default_rng(12)
    truth = {256: 1.08, 512: 1.04, 768: 1.0}
    section = ServingModel(path_scale={"mixed-graph": 1.0}, bucket_scale={"mixed-graph": {"768": 0.99}})

    def host(name: str, level: float, counts: dict) -> dict:
        buckets = np.concatenate([np.full(n, b) for b, n in counts.items()])
        n = len(buckets)
        served = level * 0.02 * np.vectorize(truth.get)(buckets) * (1 + rng.normal(0, 0.003, n))
        return {"path": ["mixed-graph"] * n, "model_s": np.full(n, 0.02), "attention_s": np.zeros(n),
                "heat": np.zeros(n), "host": [name] * n, "pass_s": served, "num_samples": np.full(n, 4),
                "prefill_tokens": np.full(n, 200), "bucket": buckets}

    passes = joined(host("a", 0.90, {768: 300, 256: 40}), host("b", 1.00, {512: 300, 768: 30, 256: 40}),
                    host("c", 1.05, {512: 150, 768: 250, 256: 40}))
    scales, fit = fit_bucket_scales(passes, section)
    factors = scales["mixed-graph"]
    assert factors[512] / factors[768] == pytest.approx(1.04, abs=0.003)
    assert factors[256] / factors[768] == pytest.approx(1.08, abs=0.003)
    # the hosts' median passes: a's at 768 (priced at 0.99 before), c's at 768 and b's at 512 (at 1 before)
    assert factors[768] == pytest.approx(0.99, abs=0.003)
    assert fit["mixed-graph"]["hosts"] == 3 and fit["mixed-graph"]["bucket_hosts"] == {"256": 3, "512": 2, "768": 3}


def test_a_bucket_shape_is_robust_to_one_hosts_odd_bucket():
    """Four hosts at offsets 0.9-1.05 over buckets that overlap in part; one host's 256 bucket ran 30% slow (a
    noisy few passes): the median polish keeps the shape the other hosts agree on."""
    truth = {256: 1.08, 512: 1.04, 768: 1.0, 1024: 1.03}
    hosts = {"a": (0.90, (768, 256, 512)), "b": (1.00, (512, 768, 256)), "c": (1.05, (1024, 768, 256)),
             "d": (0.95, (512, 1024))}
    medians = {(h, b): offset * truth[b] for h, (offset, buckets) in hosts.items() for b in buckets}
    shape = bucket_shape(medians)
    assert {b: shape[b] / shape[768] for b in truth} == pytest.approx(truth)
    shape = bucket_shape({**medians, ("a", 256): 1.3 * medians["a", 256]})
    assert shape[256] / shape[768] == pytest.approx(1.08, abs=1e-9)


def test_a_pass_that_discarded_a_step_ahead_is_no_level():
    """A greedy run's pass that discarded a decode step enqueued ahead carries that step's work (the greedy
    section's "discarded" prices it) and is mostly a fresh prompt's first chunk, in a small bucket: a fit of levels
    or buckets leaves it out, and rows that do not say count as not discarded."""
    section = ServingModel(path_scale={"mixed-graph": 1.0})
    n = 200
    buckets = np.array([768] * n + [384] * n)
    discarded = np.array([False] * n + [True, False] * (n // 2))
    served = 0.02 * np.where(discarded, 1.3, 1.0)
    passes = {"path": ["mixed-graph"] * 2 * n, "model_s": np.full(2 * n, 0.02), "attention_s": np.zeros(2 * n),
              "heat": np.zeros(2 * n), "host": ["a"] * 2 * n, "pass_s": served, "num_samples": np.full(2 * n, 4),
              "prefill_tokens": np.full(2 * n, 200), "bucket": buckets}
    assert fit_bucket_scales({**passes, "discarded": discarded}, section)[0]["mixed-graph"] == pytest.approx(
        {384: 1.0, 768: 1.0})
    counted = fit_bucket_scales(passes, section)[0]["mixed-graph"]
    assert counted[384] / counted[768] == pytest.approx(1.15)
    assert fit_path_levels({**passes, "discarded": discarded}, section)[0]["mixed-graph"] == pytest.approx(1.0)


@pytest.mark.parametrize("scales, message", [
    ({"decode-graph": {"256": 1.1}}, "path 'decode-graph' replays no bucketed graph"),
    ({"mixed-graph": {"0": 1.1}}, "bucket '0' must be a positive token count"),
    ({"mixed-graph": {"2.5e2": 1.1}}, "bucket '2.5e2' must be a positive token count"),
    ({"mixed-graph": {"256": 0.0}}, r"bucket_scale\[mixed-graph\]\[256\] must be a finite number"),
    ({"mixed-graph": [1.1]}, "must be an object of buckets"),
])
def test_a_damaged_bucket_scale_is_named(scales, message):
    with pytest.raises(ValueError, match=message):
        ServingModel.from_dict({**ServingModel().to_dict(), "bucket_scale": scales})


def test_a_profile_prices_a_mixed_pass_at_its_buckets_factor():
    """The shipped llama-2-7b profile, its buckets at the path's scale but for a factor on the 256-token one: a
    mixed-graph pass padded to 256 costs that much more served step (its loop and spread unchanged), one padded to
    512 as before; the shipped profile prices its buckets (the 240-token one dearest)."""
    shipped = load_profile("llama-2-7b-h200-bf16")
    profile = shipped.with_serving(ServingModel.from_dict({**shipped.serving.to_dict(), "bucket_scale": {}}))
    grown = profile.with_serving(profile.serving.with_bucket_scale({"mixed-graph": {256: 1.1}}))

    def mixed(tokens: int, decodes: int = 8) -> PassFeatures:
        return PassFeatures(num_tokens=tokens, prefill_tokens=tokens - decodes, decode_tokens=decodes,
                            num_seqs=decodes + 1, prefill_seqs=1, decode_context=decodes * 1000,
                            prefill_attention=(tokens - decodes) * 1500, num_samples=decodes + 1)

    f = mixed(250)
    assert profile.model.bucket(f) == 256 and profile.model.bucket(mixed(8, 8)._replace(prefill_tokens=0)) == 0
    step = profile.serving.step_seconds("mixed-graph", profile.model.predict(f)
                                        + profile.serving.attention_scale["mixed-graph"]
                                        * profile.model.attention_seconds(f), f.num_samples)
    grown_step = 0.1 * (step - profile.serving.step_per_sample_s * f.num_samples)
    assert grown.predict(f, 0.0) - profile.predict(f, 0.0) == pytest.approx(grown_step)
    assert grown.predict(mixed(500), 0.3) == profile.predict(mixed(500), 0.3)
    assert shipped.predict(mixed(240), 0.3) > profile.predict(mixed(240), 0.3)
    assert max(shipped.serving.bucket_scale["mixed-graph"].items(), key=lambda kv: kv[1])[0] == 240
