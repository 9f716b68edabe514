"""The energy of passes: a profile's energy section (format, checks, fit), the sweep's measurement, and the
simulator's joules, fleet power and energy per request."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from calibration.energy import TERMS, EnergyModel, fit_energy
from calibration.profile import load_profile
from engine.policy import PassFeatures, PolicyConfig, plan_features
from sim.cluster import ClusterConfig, simulate
from sim.metrics import summarize, summary_table
from sim.workload import Workload

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
COEF = {"intercept": 1.5, "tokens": 0.009, "decode_context": 6e-5, "prefill_attention": 1.3e-6}


def synthetic_passes(n: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    decodes = rng.integers(0, 64, n)
    chunk = rng.integers(0, 1024, n) * (rng.random(n) < 0.7)
    decodes[decodes + chunk == 0] = 1
    context = rng.integers(64, 2048, n)
    X = {"num_tokens": decodes + chunk, "decode_context": decodes * context, "prefill_attention": chunk * chunk}
    seconds = 0.004 + 2.5e-5 * X["num_tokens"] + 5e-9 * X["decode_context"]
    return X, seconds


def test_the_fit_recovers_known_coefficients():
    X, seconds = synthetic_passes(80)
    truth = EnergyModel(150.0, COEF)
    joules = truth.predict_array(seconds, X)
    model = fit_energy(X, seconds, joules, idle_w=150.0, power_limit_w=700.0, source={"source": "synthetic"})
    for term in TERMS:
        assert model.coef[term] == pytest.approx(COEF[term], rel=1e-6), term
    assert model.fit["source"] == "synthetic" and model.fit["passes"] == 80 and model.fit["max_abs_rel_err"] < 1e-9
    noisy = joules * np.random.default_rng(1).lognormal(0.0, 0.02, len(joules))
    model = fit_energy(X, seconds, noisy, idle_w=150.0)
    assert model.coef["tokens"] == pytest.approx(COEF["tokens"], rel=0.05)
    assert 0.005 < model.fit["median_abs_rel_err"] < 0.03


def test_the_fit_refuses_too_few_or_bad_passes():
    X, seconds = synthetic_passes(3)
    with pytest.raises(ValueError, match="at least 4 measured passes"):
        fit_energy(X, seconds, np.ones(3), idle_w=100.0)
    X, seconds = synthetic_passes(10)
    with pytest.raises(ValueError, match="positive finite joules"):
        fit_energy(X, seconds, np.full(10, np.nan), idle_w=100.0)


def test_pass_and_run_joules_agree():
    model = EnergyModel(150.0, COEF, 700.0)
    f = PassFeatures(num_tokens=768, prefill_tokens=704, decode_tokens=64, num_seqs=65, prefill_seqs=1,
                     decode_context=65536, prefill_attention=704 * 704, num_samples=65)
    one = model.pass_joules(0.025, f)
    assert one == pytest.approx(150.0 * 0.025 + 1.5 + 0.009 * 768 + 6e-5 * 65536 + 1.3e-6 * 704**2)
    # two such passes in 0.1 s: their energies plus idle power in between
    assert model.run_joules(0.1, 2, 2 * 768, 2 * 65536, 2 * 704**2) == pytest.approx(2 * one + 150.0 * 0.05)


def _profile_dict() -> dict:
    return load_profile("llama-2-7b-h100-bf16").to_dict()


def test_the_energy_section_round_trips(tmp_path):
    profile = load_profile("llama-2-7b-h100-bf16")
    assert profile.energy is not None
    path = profile.save(tmp_path / "p.json")
    again = load_profile(path)
    assert again.energy.to_dict() == profile.energy.to_dict()
    assert json.loads(path.read_text())["energy"]["version"] == 1
    bare = profile.with_energy(None).save(tmp_path / "bare.json")
    assert "energy" not in json.loads(bare.read_text()) and load_profile(bare).energy is None


def test_profiles_of_earlier_versions_load_without_energy(tmp_path):
    d = _profile_dict()
    d.pop("energy")
    d["version"] = 3
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(d))
    assert load_profile(path).energy is None


@pytest.mark.parametrize("mutate, message", [
    (lambda e: e["coef"].update(tokens=-0.01), "coef.tokens must be a finite number >= 0"),
    (lambda e: e.update(idle_w="150"), "idle_w must be a finite number"),
    (lambda e: e["coef"].pop("decode_context"), "missing 'decode_context'"),
    (lambda e: e["coef"].update(flops=1.0), "unknown 'flops'"),
    (lambda e: e.update(version=2), "section version 2 is not supported"),
    (lambda e: e.update(form="per-path"), "form 'per-path' is not supported"),
    (lambda e: e.update(watts=3), "unknown key 'watts'"),
    (lambda e: e.update(idle_w=800.0), "must be below power_limit_w"),
    (lambda e: e.pop("idle_w"), "lacks 'idle_w'"),
])
def test_a_bad_energy_section_is_refused_by_name(tmp_path, mutate, message):
    d = _profile_dict()
    mutate(d["energy"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def test_the_shipped_sections_are_those_the_benchmark_data_give():
    """The H200 profile's section is fitted from the benchmark's passes; the H100's was swept (below)."""
    from benchmarks.pass_energy_fit import fit_from_benchmark

    for card in ("h200",):
        profile = load_profile(f"llama-2-7b-{card}-bf16")
        model, loo = fit_from_benchmark(RESULTS / f"pass_energy_{card}.json", profile)
        assert model.coef == pytest.approx(profile.energy.coef, rel=1e-9)
        assert model.idle_w == profile.energy.idle_w and model.power_limit_w == profile.energy.power_limit_w
        fit = profile.energy.fit
        assert fit["source"] == f"benchmarks/results/pass_energy_{card}.json" and fit["passes"] == len(loo) == 12
        assert "not swept" in fit["method"] and fit["median_abs_rel_err"] < 0.03


def test_the_sweep_measures_joules_per_pass_over_back_to_back_replays():
    from calibration.sweep import PointTimer, pass_energy

    runs = []
    runner = SimpleNamespace(run=lambda plan: runs.append(plan))

    class Meter:  # 2 J a pass, as NVML's counter would read
        def __enter__(self):
            self.start = len(runs)
            return self

        def __exit__(self, *exc):
            self.joules = 2.0 * (len(runs) - self.start)

    import torch

    row = pass_energy(PointTimer(runner, torch.device("cpu")), "plan", Meter(), seconds=0.0)
    assert row["joules"] == pytest.approx(2.0) and row["energy_passes"] >= 10 and row["energy_pass_s"] > 0


def test_a_profile_fit_from_swept_points_carries_energy_and_its_held_out_error():
    from calibration.fitting import build_profile

    X, seconds = synthetic_passes(60)
    truth = EnergyModel(120.0, COEF)
    joules = truth.predict_array(seconds, X)
    points = []
    for i in range(60):
        t, c = int(X["num_tokens"][i]), int(X["decode_context"][i])
        chunk = int(round(math.sqrt(X["prefill_attention"][i])))
        points.append({"sweep": "mixed", "key": str(i), "num_tokens": t, "prefill_tokens": chunk,
                       "decode_tokens": t - chunk, "num_seqs": t - chunk + (chunk > 0), "prefill_seqs": int(chunk > 0),
                       "decode_context": c, "prefill_attention": chunk * chunk, "num_samples": t - chunk + 1,
                       "wall_s": float(seconds[i]), "joules": float(joules[i]), "energy_pass_s": float(seconds[i])})
    meta = {"model": "m", "card": "c", "dtype": "bf16", "tensor_parallel": 1, "kind": "measured",
            "idle_w": 120.0, "power_limit_w": 700.0}
    profile = build_profile(points, meta, 16, 1000, 4096)
    assert profile.energy.coef == pytest.approx(COEF, rel=1e-6)
    assert profile.energy.fit["source"] == "swept" and profile.energy.fit["heldout"]["n"] == 12
    assert build_profile(points, {k: v for k, v in meta.items() if k != "idle_w"}, 16, 1000, 4096).energy is None


def _tiny_run(cost, on_pass=None):
    config = ClusterConfig(cost, replicas=2, policy=PolicyConfig(token_budget=512, balancer="round-robin"))
    workload = Workload(num_requests=24, rate=6.0, prompt="normal:600:0.3", output="normal:24:0.3")
    return simulate(workload, config, seed=3, on_pass=on_pass)


def test_the_simulators_energy_is_the_sum_of_its_passes_and_idle_power():
    profile = load_profile("llama-2-7b-h100-bf16")
    energy = profile.energy
    passes, busy = [], [0.0, 0.0]

    def on_pass(replica, plan, start, end, delivered):
        passes.append(energy.pass_joules(end - start, plan_features(plan)))
        busy[replica] += end - start

    result = _tiny_run(profile, on_pass)
    c = result.columns
    span = float(c["finish"].max() - c["arrival"].min())
    expected = sum(passes) + energy.idle_w * sum(span - b for b in busy)
    assert result.energy_j == pytest.approx(expected, rel=1e-9)
    s = summarize(result)
    assert s["energy_kwh"] == pytest.approx(expected / 3.6e6)
    assert s["fleet_power_w"] == pytest.approx(expected / span)
    assert s["energy_per_request_j"] == pytest.approx(expected / 24)
    assert 2 * energy.idle_w < s["fleet_power_w"] < 2 * energy.power_limit_w
    table = summary_table([s]).to_string()
    assert " J" in table and " W" in table and "kWh" in table


def test_without_an_energy_section_the_simulator_reports_nan():
    profile = load_profile("llama-2-7b-h100-bf16").with_energy(None)
    s = summarize(_tiny_run(profile))
    assert all(math.isnan(s[k]) for k in ("energy_kwh", "fleet_power_w", "energy_per_request_j"))


def test_the_swept_section_is_the_fit_of_its_own_points():
    """The H100 profile's section comes from its sweep's NVML joules: refitting its points gives it again."""
    from calibration.fitting import energy_from_points

    profile = load_profile("llama-2-7b-h100-bf16")
    assert profile.energy.fit["source"] == "swept" and profile.energy.fit["passes"] >= 200
    split = {s: [p for p in profile.points if p["split"] == s] for s in ("train", "heldout")}
    model = energy_from_points(split["train"], split["heldout"], profile.meta)
    assert model.coef == pytest.approx(profile.energy.coef, rel=1e-9) and model.idle_w == profile.energy.idle_w
    assert model.fit["heldout"] == pytest.approx(profile.energy.fit["heldout"])
