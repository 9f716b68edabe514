"""Calibration: the cost model fit, the profile file (save, load, rejection), and plan-based prediction."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from calibration import cost_model, plans
from calibration.fitting import build_profile, split_points
from calibration.profile import FORMAT, VERSION, Profile, load_profile, shipped_profiles
from engine.block_manager import BlockManager

KNOTS = (256.0, 1024.0)
TRUE = {"intercept": 4e-3, "tokens": 2e-6, "hinge_0": 2.5e-5, "hinge_1": 1e-5, "decode_context": 2e-8,
        "prefill_attention": 3e-10, "num_seqs": 1.5e-5, "prefill_seqs": 5e-5}
GRAPH = {**TRUE, "intercept": 3e-3, "decode_context": 1.5e-8}


def synthetic_points(model, seed: int = 0, noise: float = 0.002) -> list[dict]:
    rng = np.random.default_rng(seed)
    points = []
    for spec in plans.sweep_specs(4096, 6000, 16, seed=seed):
        f = plans.spec_features(spec)
        t = model.predict(f)
        reps = sorted(t * float(x) for x in np.exp(rng.normal(0.0, noise, size=5)))
        points.append({"sweep": spec.sweep, **f, "wall_s": reps[2], "wall_repeats": reps})
    return points


def truth_model() -> cost_model.PassModel:
    return cost_model.PassModel(cost_model.CostModel(KNOTS, GRAPH), cost_model.CostModel(KNOTS, TRUE), 256)


def synthetic_profile(**kw) -> Profile:
    meta = {"model": "synthetic", "card": "none", "dtype": "bf16", "tensor_parallel": 1, "kind": "analytic",
            "graph_max_batch": 256}
    return build_profile(synthetic_points(truth_model(), **kw), meta, 16, 6000, 4096, knots=KNOTS)


def test_fit_recovers_known_parameters_of_each_path():
    profile = synthetic_profile()
    assert profile.model.graph_max_batch == 256
    for name, value in TRUE.items():
        assert profile.model.eager.coef[name] == pytest.approx(value, rel=0.1), name
    graph = profile.model.graph.coef  # decode-only passes: one token per sequence, so only the sum is identified
    for name in ("intercept", "decode_context"):
        assert graph[name] == pytest.approx(GRAPH[name], rel=0.1), name
    assert graph["tokens"] + graph["num_seqs"] == pytest.approx(GRAPH["tokens"] + GRAPH["num_seqs"], rel=0.1)
    assert profile.fit["heldout"]["median_abs_rel_err"] < 0.005
    assert profile.fit["heldout"]["n"] > 0 and profile.fit["train"]["n"] > profile.fit["heldout"]["n"]


def test_fit_drops_knots_without_data_and_predicts_through_segments():
    pts = [p for p in synthetic_points(cost_model.CostModel(KNOTS, TRUE)) if p["num_tokens"] <= 900]
    X = {n: np.array([p[n] for p in pts], dtype=float) for n in cost_model.FEATURES}
    model = cost_model.fit(X, np.array([p["wall_s"] for p in pts]), (256.0, 1024.0, 100000.0))
    assert model.knots == [256.0]
    rel = cost_model.relative_errors(model, X, np.array([p["wall_s"] for p in pts]))
    assert np.median(np.abs(rel)) < 0.01


def test_fit_recovers_a_host_floor():
    truth = cost_model.CostModel(KNOTS, TRUE, {"floor": 1.6e-2, "floor_seqs": 2e-5, "floor_tokens": 0.0})
    pts = synthetic_points(truth, noise=0.001)
    X = {n: np.array([p[n] for p in pts], dtype=float) for n in cost_model.FEATURES}
    y = np.array([p["wall_s"] for p in pts])
    model = cost_model.fit(X, y, KNOTS, floor=True)
    assert model.floor["floor"] == pytest.approx(1.6e-2, rel=0.05)
    assert np.median(np.abs(cost_model.relative_errors(model, X, y))) < 0.003
    linear = cost_model.fit(X, y, KNOTS)
    assert np.median(np.abs(cost_model.relative_errors(linear, X, y))) > 0.01


def test_scalar_and_vector_predictions_agree():
    model = truth_model()
    pts = synthetic_points(model, noise=0.0)[:50]
    X = {n: np.array([p[n] for p in pts], dtype=float) for n in cost_model.FEATURES}
    np.testing.assert_allclose(model.predict_array(X), [model.predict(p) for p in pts], rtol=1e-12)


def test_heldout_split_is_per_sweep_and_seeded():
    pts = [{"sweep": s} for s in ["a"] * 50 + ["b"] * 10]
    labels = split_points(pts, 0.2, seed=3)
    assert labels == split_points(pts, 0.2, seed=3)
    assert labels[:50].count("heldout") == 10 and labels[50:].count("heldout") == 2


def test_save_load_round_trip(tmp_path):
    profile = synthetic_profile()
    path = profile.save(tmp_path / "p.json")
    loaded = load_profile(path)
    assert loaded.meta == profile.meta and loaded.fit == profile.fit
    assert (loaded.block_size, loaded.num_kv_blocks, loaded.max_model_len) == (16, 6000, 4096)
    assert loaded.points == profile.points and loaded.noise == profile.noise
    for p in profile.points[:40]:
        assert loaded.predict(p) == profile.predict(p)


def _write(tmp_path, data) -> str:
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(version=VERSION + 1), "version"),
    (lambda d: d.pop("version"), "version"),
    (lambda d: d.update(format="other"), "format"),
    (lambda d: d.pop("num_kv_blocks"), "num_kv_blocks"),
    (lambda d: d.update(block_size=0), "block_size"),
    (lambda d: d["meta"].pop("card"), "card"),
    (lambda d: d["cost_model"]["eager"]["coef"].pop("tokens"), "tokens"),
    (lambda d: d["cost_model"]["graph"].update(knots=[5, 3]), "increasing"),
    (lambda d: d["cost_model"].pop("graph_max_batch"), "graph_max_batch"),
    (lambda d: d["cost_model"].update(form="other"), "per-path"),
    (lambda d: d.update(noise=[1.0, -2.0]), "noise"),
    (lambda d: d["points"]["rows"][0].pop(), "row 0"),
    (lambda d: d["points"]["columns"].remove("decode_context"), "decode_context"),
])
def test_malformed_or_other_version_rejected(tmp_path, mutate, message):
    data = synthetic_profile().to_dict()
    mutate(data)
    with pytest.raises(ValueError, match=message):
        load_profile(_write(tmp_path, data))


def test_not_json_and_not_an_object_rejected(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(_write(tmp_path, "{oops"))
    with pytest.raises(ValueError, match="JSON object"):
        load_profile(_write(tmp_path, "[1, 2]"))


def test_unknown_name_lists_shipped_profiles():
    with pytest.raises(ValueError, match="shipped: .*llama-2-7b"):
        load_profile("no-such-model")


def test_shipped_profiles_load_with_capacity_and_heldout_errors():
    names = shipped_profiles()
    assert any(n.startswith("llama-2-7b") for n in names)
    for name in names:
        p = load_profile(name)
        assert p.meta["kind"] in ("measured", "analytic") and p.num_kv_blocks > 0
        assert p.fit["heldout"]["n"] > 0


def test_predict_plan_equals_predict_of_features():
    profile = synthetic_profile()
    rng = np.random.default_rng(1)
    specs = plans.sweep_specs(4096, 6000, 16, seed=1)
    for spec in specs[:: max(1, len(specs) // 60)]:
        _, plan, _ = plans.build_plan(spec, BlockManager(6000, 16), rng, 32000, 4096)
        assert plan.features() == plans.spec_features(spec)
        assert profile.predict_plan(plan) == profile.predict(plan.features())


def test_predict_plan_equals_predict_of_features_for_shipped_profiles_and_both_paths():
    # predict_plan inlines both paths' coefficients: it must stay bit-identical to predict(features()), on
    # decode-only passes (graph path, up to and past graph_max_batch) and mixed ones, with and without a floor.
    from engine.request import Request
    from engine.scheduler import BatchPlan

    rng = np.random.default_rng(5)
    for name in [*shipped_profiles(), None]:
        profile = load_profile(name) if name else synthetic_profile()
        gmb = profile.model.graph_max_batch
        for _ in range(300):
            plan = BatchPlan()
            for _ in range(int(rng.choice([1, 2, 7, gmb, gmb + 1, int(rng.integers(1, 300))]))):
                plan.requests.append(Request("d", num_prompt_tokens=1))
                plan.start_positions.append(int(rng.integers(0, 4000)))
                plan.num_new_tokens.append(1)
                plan.num_decodes += 1
            for _ in range(int(rng.integers(0, 3)) if plan.num_decodes > 1 else int(rng.integers(1, 3))):
                n = int(rng.integers(1, 2048))
                plan.requests.append(Request("p", num_prompt_tokens=n))
                plan.start_positions.append(int(rng.integers(0, 3000)))
                plan.num_new_tokens.append(n)
                plan.num_prefill_tokens += n
            assert profile.predict_plan(plan) == profile.predict(plan.features()), name


def test_noise_factors_equal_sample_factor_draws():
    profile = synthetic_profile()
    u = np.random.default_rng(3).random(5000)

    class Fixed:
        def __init__(self, values):
            self.values = iter(values.tolist())

        def random(self):
            return next(self.values)

    fixed = Fixed(u)
    assert profile.noise_factors(u) == [profile.sample_factor(fixed) for _ in range(len(u))]
    quiet = Profile(profile.meta, 16, 10, 100, profile.model)
    assert quiet.noise_factors(u[:3]) == [1.0, 1.0, 1.0]


def test_sample_factor_draws_from_measured_spread():
    profile = synthetic_profile()
    draws = [profile.sample_factor(np.random.default_rng(7)) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    many = np.array([profile.sample_factor(np.random.default_rng(i)) for i in range(2000)])
    assert min(profile.noise) <= many.min() and many.max() <= max(profile.noise)
    assert 0.001 < np.std(many) < 0.01 and abs(np.median(many) - 1.0) < 0.005
    quiet = Profile(profile.meta, 16, 10, 100, profile.model)
    assert quiet.sample_factor(np.random.default_rng(0)) == 1.0


def test_profile_module_does_not_import_torch():
    code = "import sys, calibration.profile, calibration.cost_model; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_format_constant_written():
    d = synthetic_profile().to_dict()
    assert d["format"] == FORMAT and d["version"] == VERSION


def test_knot_selection_by_cross_validation_finds_a_kink_coarse_knots_miss():
    truth = cost_model.CostModel((2048.0,), {**{k: v for k, v in TRUE.items() if not k.startswith("hinge")},
                                             "hinge_0": 6e-5})
    pts = synthetic_points(truth)
    X = {n: np.array([p[n] for p in pts], dtype=float) for n in cost_model.FEATURES}
    name, scores = cost_model.select(X, np.array([p["wall_s"] for p in pts]))
    assert not name.startswith("coarse") and scores["coarse"] > 2 * scores[name]


def test_plots_write_latency_and_throughput_html(tmp_path):
    pytest.importorskip("plotly")
    from calibration.plots import write_plots

    written = write_plots(synthetic_profile(), tmp_path, png=False)
    assert sorted(p.name.rsplit("-", 1)[-1] for p in written) == ["latency.html", "throughput.html"]
    assert all("synthetic" in p.read_text() for p in written)
