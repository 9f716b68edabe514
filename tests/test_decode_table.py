"""The decode-graph table: per batch size a line in the summed context, jumps between sizes kept."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration import cost_model, plans
from calibration.decode_table import DecodeTable, fit_decode_table
from calibration.fitting import build_profile
from calibration.profile import load_profile
from engine.policy import PassFeatures, plan_features


def true_seconds(n, context):
    """A decode step with a wave jump: 17 sequences and more take a second wave of attention."""
    per_token = 2e-7 if n <= 16 else 3e-7
    return 5e-3 + 2e-5 * n + per_token * context


def decode(n, context):
    return PassFeatures(n, 0, n, n, 0, context, 0, n)


def test_fit_recovers_each_size_and_its_jump():
    sizes = np.repeat(np.arange(1, 33), 4)
    contexts = sizes * np.tile([200, 600, 1500, 3500], 32)
    seconds = np.array([true_seconds(n, c) for n, c in zip(sizes, contexts)])
    table = fit_decode_table(sizes, contexts, seconds)
    assert table.seqs == list(range(1, 33))
    for n in (1, 16, 17, 32):
        for c in (200 * n, 3000 * n):
            assert table.predict(n, c) == pytest.approx(true_seconds(n, c), rel=1e-6)
    assert table.predict(17, 2700 * 17) / table.predict(16, 2700 * 16) > 1.2  # the jump a line would smooth


def test_between_sizes_interpolates_at_the_same_mean_context_and_outside_is_none():
    table = DecodeTable([8, 16], [5e-3, 6e-3], [1e-7, 2e-7])
    mean = 1000
    lo, hi = 5e-3 + 1e-7 * mean * 8, 6e-3 + 2e-7 * mean * 16
    assert table.predict(12, 12 * mean) == pytest.approx((lo + hi) / 2)
    assert table.predict(7, 7000) is None and table.predict(17, 17000) is None
    got = table.predict_array(np.array([7, 8, 12]), np.array([7000, 8000, 12000]))
    assert np.isnan(got[0]) and got[1:] == pytest.approx([table.predict(8, 8000), table.predict(12, 12000)])


def test_sizes_without_a_context_span_are_left_to_their_neighbours():
    """Two close contexts would make a slope of noise: that size is skipped, and interpolated instead."""
    sizes = np.array([4, 4, 8, 8, 12, 12])
    contexts = np.array([4 * 200, 4 * 3000, 8 * 700, 8 * 760, 12 * 200, 12 * 3000])
    seconds = np.array([true_seconds(n, c) for n, c in zip(sizes, contexts)])
    table = fit_decode_table(sizes, contexts, seconds)
    assert table.seqs == [4, 12]
    assert fit_decode_table(np.array([8, 8]), np.array([5600, 6080]), seconds[2:4]) is None


@pytest.mark.parametrize("args, message", [
    (([], [], []), "one intercept and one slope"),
    (([4, 2], [1.0, 1.0], [0.0, 0.0]), "increasing"),
    (([1, 2], [1.0, float("nan")], [0.0, 0.0]), "finite"),
    (([1, 2], [1.0, 1.0], [0.0, -1e-7]), "non-negative"),
])
def test_malformed_tables_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        DecodeTable(*args)


def test_the_pass_model_takes_the_table_for_decode_graph_passes_alone():
    hinge = cost_model.HingeModel([16], {"intercept": 4e-3, "tokens": 1e-5, "hinge_0": 0.0, "decode_context": 1e-7,
                                         "prefill_attention": 0.0, "num_seqs": 0.0, "prefill_seqs": 0.0,
                                         "decode_launch": 0.0})
    table = DecodeTable([4, 8], [5e-3, 6e-3], [2e-7, 3e-7])
    model = cost_model.PassModel(hinge, hinge, 256, decode_table=table)
    assert model.predict(decode(4, 4000)) == pytest.approx(table.predict(4, 4000))
    assert model.predict(decode(64, 64000)) == pytest.approx(hinge.predict(decode(64, 64000)))  # past the table
    prefill = PassFeatures(100, 100, 0, 1, 1, 0, 5050, 1)
    assert model.predict(prefill) == pytest.approx(hinge.predict(prefill))
    feats = [decode(4, 4000), decode(6, 9000), decode(64, 64000), prefill]
    X = {f: np.array([getattr(p, f) for p in feats]) for f in cost_model.FEATURES}
    assert model.predict_array(X) == pytest.approx([model.predict(p) for p in feats])
    again = cost_model.PassModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.decode_table.to_dict() == table.to_dict()


def test_a_profile_fits_its_table_from_the_table_sweep_and_saves_it(tmp_path):
    rng = np.random.default_rng(2)
    points = []
    specs = plans.sweep_specs(4096, 14000, 16, seed=0, table_per_size=4)
    for spec in specs:
        f = plan_features(spec)._asdict()
        if f["num_tokens"] == f["num_seqs"]:
            t = true_seconds(f["num_seqs"], f["decode_context"])
        else:
            t = 5e-3 + 3e-5 * f["num_tokens"] + 1e-7 * f["decode_context"] + 1e-10 * f["prefill_attention"]
        t *= float(np.exp(rng.normal(0, 0.002)))
        points.append({"sweep": spec.sweep, **f, "wall_s": t, "wall_repeats": [t] * 3})
    meta = {"model": "synthetic", "card": "none", "dtype": "bf16", "tensor_parallel": 1, "kind": "measured",
            "graph_max_batch": 512}
    profile = build_profile(points, meta, 16, 14000, 4096)
    assert profile.fit["selection"]["graph"]["decode_table_sizes"] >= 64
    assert profile.fit["heldout_by_sweep"]["decode-table"]["p95_abs_rel_err"] < 0.02
    assert profile.predict(decode(17, 17 * 2700)) == pytest.approx(true_seconds(17, 17 * 2700), rel=0.02)
    profile.save(tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")
    assert loaded.model.decode_table.to_dict() == profile.model.decode_table.to_dict()
    d = json.loads((tmp_path / "p.json").read_text())
    d["cost_model"]["decode_table"]["slope"][0] = -1.0
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="non-negative"):
        load_profile(tmp_path / "bad.json")
