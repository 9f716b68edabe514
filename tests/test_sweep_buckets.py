"""calibration.sweep_buckets: the factors per graph bucket no served pass showed, from the sweep's shape."""

import pytest
from click.testing import CliRunner

from calibration.profile import Profile, load_profile, point_features
from calibration.serving import ServingModel
from calibration.sweep_buckets import sweep_bucket_shape, with_served_buckets, with_sweep_buckets
from sim.sweep_buckets import main
from sim.validate import simulated_overload_rps


def shape_of(bucket: int) -> float:
    """The factor over the line the hand-made sweep below times each bucket at."""
    return 1.0 + bucket / 10_000


@pytest.fixture(scope="module")
def shaped():
    """mistral-7b's profile whose swept mixed-graph passes take ``shape_of`` their bucket times the line's price, and
    whose section prices two buckets of the mixed-graph path from served passes, and no other."""
    p = load_profile("mistral-7b-h200-bf16")
    target = p.fit.get("target", "wall_s")
    points = []
    for point in p.points:
        f = point_features(point)
        if p.model.path(f) == "mixed-graph":
            point = {**point, target: p.model.predict(f) * shape_of(p.model.bucket(f))}
        points.append(point)
    d = p.serving.to_dict()
    bare = ServingModel.from_dict({**{k: v for k, v in d.items() if k != "bucket_scale"},
                                   "fit": {k: v for k, v in d["fit"].items() if k != "sweep_buckets"}})
    serving = bare.with_bucket_scale({"mixed-graph": {256: 1.1, 768: 0.9}}, {"n": 1})
    return Profile(p.meta, p.block_size, p.num_kv_blocks, p.max_model_len, p.model, points=points, noise=p.noise,
                   fit=p.fit, serving=serving, hosts=p.hosts)


def test_the_shape_is_the_sweeps_median_per_bucket_of_enough_passes(shaped):
    shape, counts = sweep_bucket_shape(shaped)
    assert set(shape) == set(counts) and min(counts.values()) >= 10 and {16, 768, 1024} <= set(shape)
    assert all(shape[b] == pytest.approx(shape_of(b)) for b in shape)
    fewer, _ = sweep_bucket_shape(shaped, min_count=30)
    assert set(fewer) == {b for b, n in counts.items() if n >= 30} and set(fewer) < set(shape)


def test_missing_buckets_take_the_nearest_served_factor_times_the_sweeps_ratio(shaped):
    filled = with_sweep_buckets(shaped, reference=768)
    graph, alone = filled.serving.bucket_scale["mixed-graph"], filled.serving.bucket_scale["mixed-prefill"]
    assert graph[256] == 1.1 and graph[768] == 0.9  # served factors stay
    assert graph[1024] == pytest.approx(0.9 * shape_of(1024) / shape_of(768))
    assert graph[16] == pytest.approx(1.1 * shape_of(16) / shape_of(256))
    assert graph[512] == pytest.approx(1.1 * shape_of(512) / shape_of(256))  # 256 is nearer than 768
    # a path with no served factor anchors at the reference bucket, where its level was fitted
    assert alone[768] == pytest.approx(1.0) and alone[1024] == pytest.approx(shape_of(1024) / shape_of(768))
    record = filled.serving.fit["sweep_buckets"]
    assert record["reference"] == 768 and 256 not in record["filled"]["mixed-graph"]
    assert 1024 in record["filled"]["mixed-graph"] and 768 in record["filled"]["mixed-prefill"]
    assert filled.hosts is shaped.hosts and filled.serving.fit["buckets"] == {"n": 1}
    again = with_sweep_buckets(filled, reference=768)  # a fill made again is the same fill, and says so
    assert again.serving.bucket_scale == filled.serving.bucket_scale and again.serving.fit == filled.serving.fit


def test_a_filled_bucket_prices_its_passes_by_its_factor(shaped):
    filled = with_sweep_buckets(shaped, reference=768)
    f = next(point_features(p) for p in shaped.points if shaped.model.path(point_features(p)) == "mixed-graph"
             and shaped.model.bucket(point_features(p)) == 1024 and point_features(p).decode_tokens)
    step = filled.serving.step_seconds("mixed-graph", 1.0, f.num_samples, bucket=1024)
    assert step / shaped.serving.step_seconds("mixed-graph", 1.0, f.num_samples, bucket=1024) == pytest.approx(
        0.9 * shape_of(1024) / shape_of(768), rel=1e-3)
    factor = filled.serving.bucket_scale["mixed-graph"][1024]
    by_hand = shaped.with_serving(shaped.serving.with_bucket_scale({"mixed-graph": {256: 1.1, 768: 0.9, 1024: factor}}))
    assert filled.predict(f) == pytest.approx(by_hand.predict(f)) and filled.predict(f) < shaped.predict(f)


def test_a_reference_bucket_the_sweep_lacks_is_refused_by_name(shaped):
    with pytest.raises(ValueError, match="0 mixed-graph passes in the 1000-token bucket"):
        with_sweep_buckets(shaped, reference=1000)
    with pytest.raises(ValueError, match="no serving section"):
        with_sweep_buckets(shaped.with_serving(None), reference=768)


def test_a_served_refit_fills_the_sweeps_buckets_again(shaped):
    filled = with_sweep_buckets(shaped, reference=768)
    refit = with_served_buckets(filled, {"mixed-graph": {512: 1.02, 768: 0.95}}, {"n": 2})
    graph = refit.serving.bucket_scale["mixed-graph"]
    assert graph[768] == 0.95 and graph[512] == 1.02
    assert graph[256] == pytest.approx(1.02 * shape_of(256) / shape_of(512))  # the old served 256 went with the refit
    assert graph[1024] == pytest.approx(0.95 * shape_of(1024) / shape_of(768))
    assert refit.serving.bucket_scale["mixed-prefill"] == filled.serving.bucket_scale["mixed-prefill"]
    assert refit.serving.fit["buckets"] == {"n": 2} and refit.hosts is shaped.hosts
    plain = with_served_buckets(shaped, {"mixed-graph": {768: 0.95}}, {"n": 2})  # never filled: served alone
    assert plain.serving.bucket_scale["mixed-graph"] == {768: 0.95} and "sweep_buckets" not in plain.serving.fit


def test_the_command_writes_a_profile_that_loads_with_the_fill(tmp_path):
    out = tmp_path / "filled.json"
    result = CliRunner().invoke(main, ["llama-2-13b-h200-bf16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1024* " in result.output and f"wrote {out}" in result.output
    written, shipped = load_profile(out), load_profile("llama-2-13b-h200-bf16")
    assert set(written.serving.bucket_scale) == {"mixed-graph", "mixed-prefill"}
    assert written.serving.bucket_scale["mixed-graph"][768] == pytest.approx(1.0)
    assert [r.host for r in written.hosts.runs] == [r.host for r in shipped.hosts.runs]
    row = next(r for r in written.hosts.runs if r.run)  # a host's overload run, simulated again on the filled prices
    assert simulated_overload_rps(written, row.run) == pytest.approx(row.simulated_rps, rel=1e-9)
    result = CliRunner().invoke(main, ["llama-2-13b-h200-bf16", "--reference", "1000", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "Error: the sweep has 0 mixed-graph passes in the 1000-token bucket" in \
        result.output and not (tmp_path / "x").exists()
    result = CliRunner().invoke(main, ["no-such-model", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "unknown profile 'no-such-model'" in result.output
