"""Every number in a profile is checked when it loads: a damaged file fails naming the field, never a NaN run."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from calibration.profile import load_profile, resolve
from sim.cli import simulate as simulate_cli

SHIPPED = json.loads(resolve("llama-2-7b").read_text())


def damaged(tmp_path, mutate) -> str:
    d = json.loads(json.dumps(SHIPPED))
    mutate(d)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(d))  # json writes NaN and Infinity as such, as a careless tool would
    return str(path)


def set_knot(d, value):
    d["cost_model"]["graph"]["knots"][3] = value


@pytest.mark.parametrize("mutate, message", [
    (lambda d: set_knot(d, math.nan), r"cost_model\.graph\.knots\[3\] is nan"),
    (lambda d: d["cost_model"]["eager"]["coef"].update(tokens=math.inf), r"cost_model\.eager\.coef\.tokens is inf"),
    (lambda d: d["noise"].__setitem__(0, math.nan), r"noise\[0\] is nan"),
    (lambda d: set_knot(d, 500.0), "strictly increasing"),
    (lambda d: d["cost_model"]["graph"]["knots"].__setitem__(0, -2.0), "positive token counts"),
    (lambda d: d["cost_model"]["eager"]["coef"].update(decode_context=-1e-6), "decode_context is -1e-06.*>= 0"),
    (lambda d: d["cost_model"]["graph"].update(floor={"floor": -0.1, "floor_seqs": 0.0, "floor_tokens": 0.0}),
     r"graph\.floor\.floor is -0\.1"),  # whether or not the shipped fit chose a floor
    (lambda d: d["cost_model"]["graph"]["coef"].update(intercept=-1.0), r"intercept is -1\.0.*>= 0"),
    (lambda d: d["cost_model"].update(eager={**d["cost_model"]["eager"], "floor": None,
                                             "coef": {**d["cost_model"]["eager"]["coef"], "num_seqs": -1.0}}),
     "predicts -.* s for a pass of 4096 tokens"),
    (lambda d: d["cost_model"].update(graph_max_batch=-1), "graph_max_batch must be >= 0"),
    (lambda d: d["points"]["rows"][0].__setitem__(d["points"]["columns"].index("wall_s"), 0.0), "wall_s must be"),
    (lambda d: d["cost_model"].update(mixed_buckets=[64, 32]), "strictly increasing"),
])
def test_a_damaged_number_is_named(tmp_path, mutate, message):
    with pytest.raises(ValueError, match=message):
        load_profile(damaged(tmp_path, mutate))


def test_a_nan_knot_stops_the_simulator_with_the_field(tmp_path):
    """Before, a NaN knot loaded and ``splitfuse simulate`` exited 0 with NaN results."""
    path = damaged(tmp_path, lambda d: set_knot(d, math.nan))
    result = CliRunner().invoke(simulate_cli, ["--profile", path, "-n", "20"])
    assert result.exit_code == 2 and "knots[3] is nan" in result.output and "Traceback" not in result.output


def test_every_shipped_profile_passes_the_checks():
    from calibration.profile import shipped_profiles

    assert all(load_profile(name).num_kv_blocks > 0 for name in shipped_profiles())


def test_every_shipped_measured_profile_knows_its_hosts():
    """Each measured profile carries the hosts it was judged on, so a plan covers the slowest of them."""
    from calibration.profile import shipped_profiles

    measured = [load_profile(n) for n in shipped_profiles() if load_profile(n).meta["kind"] == "measured"]
    assert len(measured) == 5 and all(p.hosts is not None and len(p.hosts.factors()) >= 2 for p in measured)
    # a few percent between cards, more on the mixes a profile misprices (llama-3-8b prefill-first's short mix)
    assert all(0 <= m < 0.15 for p in measured for m in (p.host_margin(), *p.hosts.margins().values()))


def test_every_shipped_point_is_priced_with_the_serving_section():
    """A profile may hold points swept before a feature existed beside newer ones (None in its column): each still
    has features, and the profile with its serving section prices it (as ``profile --check --plot`` does)."""
    from calibration.profile import point_features, shipped_profiles

    for name in shipped_profiles():
        profile = load_profile(name)
        times = [profile.predict(point_features(p)) for p in profile.points]
        assert all(math.isfinite(t) and t > 0 for t in times), name


@pytest.mark.parametrize("name", ["llama-2-7b-h200", "llama-2-7b-h100", "llama-2-13b-h200", "llama-3-8b-h200",
                                  "mistral-7b-h200"])
def test_a_shipped_profile_is_what_its_points_fit_to(tmp_path, name):
    """``splitfuse profile --refit`` gives the shipped file back: its points, split and every other section as they
    are, and a model that is its points' fit under this code. The model is compared by what it predicts, path by
    path: BLAS kernels round differently on different CPUs, and the floors' non-smooth least squares can then settle
    elsewhere on a few passes (``calibration/README.md``), so bit-for-bit equality holds only on the fitting machine.
    A change to the fit moves a path's typical pass, which this catches."""
    import numpy as np

    from calibration.cli import profile as profile_cmd
    from calibration.profile import point_features

    shipped = resolve(name)
    out = tmp_path / "refit.json"
    result = CliRunner().invoke(profile_cmd, ["--refit", str(shipped), "--out", str(out)])
    assert result.exit_code == 0, result.output
    refit, original = json.loads(out.read_text()), json.loads(shipped.read_text())
    assert refit.keys() == original.keys()
    for key in original.keys() - {"cost_model", "fit"}:
        assert refit[key] == original[key], key
    for key in ("target", "heldout_frac", "seed"):
        assert refit["fit"][key] == original["fit"][key], key
    for stat in ("median_abs_rel_err", "p95_abs_rel_err"):
        assert refit["fit"]["heldout"][stat] == pytest.approx(original["fit"]["heldout"][stat], abs=1e-3), stat
    new, old = load_profile(out), load_profile(shipped)
    features = [point_features(p) for p in old.points]
    paths = np.array([old.model.path(f) for f in features])
    change = np.abs(np.array([new.model.predict(f) / old.model.predict(f) for f in features]) - 1.0)
    for path in np.unique(paths):
        moved = change[paths == path]
        assert np.median(moved) <= 1e-3 and np.percentile(moved, 95) <= 1e-2, (path, np.median(moved), moved.max())
    result = CliRunner().invoke(profile_cmd, ["--refit", str(shipped), "--model", "tiny-llama", "--out", str(out)])
    assert result.exit_code == 2 and "--refit takes only a profile" in result.output


def test_a_profile_without_points_cannot_be_refitted(tmp_path):
    from calibration.cli import profile as profile_cmd

    d = json.loads(json.dumps(SHIPPED))
    d.pop("points")
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(d))
    result = CliRunner().invoke(profile_cmd, ["--refit", str(path), "--out", str(tmp_path / "out.json")])
    assert result.exit_code == 1 and "holds 0 points: nothing to refit" in result.output
    assert not (tmp_path / "out.json").exists()


def _added_points(meta: dict, scale: float, count: int = 100) -> tuple[dict, list[dict]]:
    """A points file's (header, points): ``count`` of the profile's eager mixed passes measured again under new
    keys, ``scale`` times as long."""
    columns, rows = SHIPPED["points"]["columns"], SHIPPED["points"]["rows"]
    mixed = [dict(zip(columns, r)) for r in rows if r[columns.index("sweep")] in ("mixed", "eager-mixed")
             and r[columns.index("num_tokens")] > 1024][:count]
    points = []
    for i, p in enumerate(mixed):
        p = {k: v for k, v in p.items() if k != "split" and v is not None}
        p.update(key=f"eager-mixed-{i}", sweep="eager-mixed", wall_s=p["wall_s"] * scale,
                 wall_repeats=[t * scale for t in p["wall_repeats"]])
        points.append(p)
    header = {k: meta.get(k) for k in ("model", "dtype", "card", "block_size", "max_model_len", "mixed_graph_buckets")}
    return {**header, "date": "2026-11-27T00:00:00+00:00", "git_commit": "abc1234"}, points


def _write_points(path, header, points):
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"header": header}, *points]))
    return str(path)


def test_added_points_are_fitted_with_the_profiles_own(tmp_path):
    """``--refit P --add-points F``: a points file of the same card joins the profile's points; the profile's own
    points keep their held-out draw, its meta records the file, and the eager path follows the new passes."""
    from calibration.cli import profile as profile_cmd

    header, points = _added_points(SHIPPED["meta"], 1.3)
    path = _write_points(tmp_path / "em.points.jsonl", header, points)
    out = tmp_path / "merged.json"
    result = CliRunner().invoke(profile_cmd, ["--refit", "llama-2-7b", "--add-points", path, "--out", str(out)])
    assert result.exit_code == 0, result.output
    merged, shipped = load_profile(out), load_profile("llama-2-7b")
    assert len(merged.points) == len(shipped.points) + len(points)
    # the held-out draw of every kind drawn before the one that grew stays (kinds are drawn in order from one
    # generator, so a larger draw moves the later kinds' draws on)
    kinds = list(dict.fromkeys(p["sweep"] for p in shipped.points))
    later = set(kinds[kinds.index("eager-mixed"):])
    own = lambda profile: [p["split"] for p in profile.points[:len(shipped.points)]  # noqa: E731
                           if p["sweep"] not in later]
    assert own(merged) == own(shipped) and len(own(shipped)) > 500
    assert merged.meta["added_points"] == [*shipped.meta.get("added_points", []),
                                           f"{len(points)} points (eager-mixed) measured on {header['card']}, "
                                           "2026-11-27T00:00:00+00:00, commit abc1234"]
    assert merged.serving.to_dict() == shipped.serving.to_dict()
    from calibration.profile import point_features

    # the same passes again, 30% longer: beside the originals, their predictions grow
    grown = [merged.model.predict(point_features(p)) / shipped.model.predict(point_features(p)) for p in points]
    assert sorted(grown)[len(grown) // 2] > 1.015 and sum(grown) / len(grown) > 1.015, grown
    # the merged profile refits to itself, as a shipped one does
    again = tmp_path / "again.json"
    assert CliRunner().invoke(profile_cmd, ["--refit", str(out), "--out", str(again)]).exit_code == 0
    assert json.loads(again.read_text()) == json.loads(out.read_text())


@pytest.mark.parametrize("change, message", [
    (lambda h, p: h.update(card="NVIDIA A100-SXM4-80GB"), "measured with card 'NVIDIA A100-SXM4-80GB'"),
    (lambda h, p: h.update(kv_layout="aged"), "kv_layout 'aged'"),
    (lambda h, p: p[0].update(key=SHIPPED["points"]["rows"][0][SHIPPED["points"]["columns"].index("key")]),
     "repeat 1 of the profile's passes"),
    (lambda h, p: p.clear(), "no header or no points"),
])
def test_added_points_of_another_measurement_are_refused(tmp_path, change, message):
    from calibration.cli import profile as profile_cmd

    header, points = _added_points(SHIPPED["meta"], 1.0, count=4)
    change(header, points)
    path = _write_points(tmp_path / "em.points.jsonl", header, points)
    out = tmp_path / "merged.json"
    result = CliRunner().invoke(profile_cmd, ["--refit", "llama-2-7b", "--add-points", path, "--out", str(out)])
    assert result.exit_code == 1 and message in result.output, result.output
    assert not out.exists()
    result = CliRunner().invoke(profile_cmd, ["--model", "tiny-llama", "--add-points", path, "--out", str(out)])
    assert result.exit_code == 2 and "--add-points goes with --refit" in result.output


def test_measured_hosts_give_each_host_its_factor_and_the_slowest_its_margin(tmp_path):
    """A host's factor is simulated over served requests/s, averaged over its runs; the margin is the slowest run's
    excess on the mix asked for (any mix's where none is of it). The section survives a save, a refit and --check; a
    new serving section drops it (it was measured against the old one), and a damaged row is named."""
    from calibration.cli import profile as profile_cmd
    from calibration.fitting import refit
    from calibration.host_spread import HostSpread, MeasuredHost

    runs = (MeasuredHost("a", "splitfuse-768", "long", 8.0, 8.4), MeasuredHost("a", "splitfuse-768", "short", 20, 20),
            MeasuredHost("b", "prefill-first-4352", "long", 9.0, 8.82))
    spread = HostSpread(runs)
    assert spread.factors() == pytest.approx({"a": 1.025, "b": 0.98}) and list(spread.factors()) == ["a", "b"]
    assert spread.margin("long") == pytest.approx(0.05)  # host a's long run, not its mean over mixes
    assert spread.margin("short") == 0 and spread.margin("chat") == spread.margin() == pytest.approx(0.05)
    assert spread.margins() == pytest.approx({"long": 0.05, "short": 0.0})
    # a scheduler's own runs of the mix where it has some, else the mix's worst
    assert spread.margin("long", scheduler="prefill-first-4352") == 0
    assert spread.margin("long", scheduler="splitfuse-512") == spread.margin("long", scheduler="splitfuse-768")
    # a mix never measured: the scheduler's runs of every mix, else every run
    assert spread.margin("chat", scheduler="prefill-first-4352") == 0 and spread.margin("chat", scheduler="x-1") > 0
    assert spread.scheduler_margins() == pytest.approx({("long", "splitfuse-768"): 0.05,
                                                        ("long", "prefill-first-4352"): 0.0})
    assert HostSpread(runs[2:]).margin() == 0  # every host keeps up with the profile
    # the typical host: the geometric mean of the runs the margin reads; a host left out judges it by the others
    assert spread.typical("long", "splitfuse-768") == pytest.approx(1.05)
    assert spread.typical("long") == pytest.approx((1.05 * 0.98) ** 0.5)
    assert spread.typical("long", "splitfuse-768", without="a") == pytest.approx(0.98)
    assert spread.typical("chat", "x-1", without="b") == pytest.approx(1.05 ** 0.5)
    assert HostSpread(runs[2:]).typical("long", without="b") == 1.0  # no other host: the profile's own price
    profile = load_profile("llama-2-7b").with_hosts(spread)
    path = profile.save(tmp_path / "hosts.json")
    again = load_profile(path)
    assert again.hosts == spread and again.host_margin("short") == 0 and again.host_margin() == pytest.approx(0.05)
    assert refit(again).hosts == spread
    assert again.with_serving(None).hosts is None and load_profile("llama-2-7b").with_hosts(None).host_margin() == 0
    result = CliRunner().invoke(profile_cmd, ["--check", str(path)])
    assert result.exit_code == 0 and "hosts: 2 measured" in result.output
    assert "long 5.0% (splitfuse-768 5.0%, prefill-first-4352 0.0%), short 0.0%; any other mix 5.0%" in result.output
    good = {"host": "a", "scheduler": "splitfuse-768", "mix": "long", "measured_rps": 8, "simulated_rps": 8}
    for row, message in (({**good, "measured_rps": 0}, "measured_rps must be a positive"),
                         ({"host": "a", "measured_rps": 8}, r"runs\[0\] must be an object with host, scheduler"),
                         ({**good, "clock": 1}, "unknown fields"),
                         ({**good, "run": {"rate": 9.0}}, "run must be an object with scheduler.*lacking scheduler"),
                         ({**good, "run": [1]}, "run must be an object")):
        with pytest.raises(ValueError, match=message):
            load_profile(damaged(tmp_path, lambda d, row=row: d.update(hosts={"runs": [row]})))
    with pytest.raises(ValueError, match="at least one measured run"):
        HostSpread(())



def test_a_cards_spread_pooled_over_its_profiles_bounds_a_new_host():
    """The spread is the runs' scatter about their own profile's mean for the mix, pooled (retired runs left out),
    its degrees of freedom counting each GPU once less one a profile; the margin is the larger of the slowest run
    and Student's t prediction bound for a new host; a profile plans with its card's spread pooled over the shipped
    profiles of other models."""
    import math

    from scipy.stats import t

    from calibration.host_spread import CardSpread, HostSpread, MeasuredHost

    def spread(factors, mix="short", first=0):
        return HostSpread(tuple(MeasuredHost(f"h{first + i}", "splitfuse-768", mix, 10.0, 10.0 * f)
                                for i, f in enumerate(factors)))

    a, b = spread([0.98, 0.99, 1.00]), spread([1.02, 1.04], "long", first=3)
    card = CardSpread.pooled([a, b])
    logs_a, logs_b = [math.log(f) for f in (0.98, 0.99, 1.00)], [math.log(f) for f in (1.02, 1.04)]
    squares = sum((x - sum(v) / len(v)) ** 2 for v in (logs_a, logs_b) for x in v)
    assert card.dof == 3 and card.sd == pytest.approx(math.sqrt(squares / 3))
    bound = math.exp(sum(logs_a) / 3 + t.ppf(0.99, 3) * card.sd * math.sqrt(1 + 1 / 3))
    assert a.margin("short", card) == pytest.approx(bound - 1) and bound > 1.0  # above the slowest run (1.00)
    assert a.margin("short") == 0 and a.margin("short", card, quantile=0.5) == pytest.approx(0.0)
    assert CardSpread.pooled([a.retire(set(), "x")]) == CardSpread.pooled([a])
    assert CardSpread.pooled([spread([1.0]), spread([1.1], "long", first=1)]) is None  # one run a mix: no scatter
    # a GPU counts once: b's two GPUs again in a (one more profile) leave 3 GPUs less 2 profiles, 1 dof
    assert CardSpread.pooled([a, spread([1.02, 1.04], "long")]) is None
    both = HostSpread(a.runs + spread([1.02, 1.04, 1.01], "long").runs)  # three GPUs, each in two mixes
    logs_long = [math.log(f) for f in (1.02, 1.04, 1.01)]
    squares_both = sum((x - sum(v) / len(v)) ** 2 for v in (logs_a, logs_long) for x in v)
    assert CardSpread.pooled([both]) == CardSpread(pytest.approx(math.sqrt(squares_both / 4)), 2)
    with pytest.raises(ValueError, match="host quantile"):
        card.bound(logs_a, 1.0)
    profile = load_profile("llama-3-8b-h200-bf16")
    own = profile.card_spread()
    others = [load_profile(n).hosts for n in ("llama-2-7b-h200-bf16", "mistral-7b-h200-bf16", "llama-2-13b-h200-bf16")]
    pooled = CardSpread.pooled([profile.hosts, *others])
    assert own.dof == pooled.dof and own.sd == pytest.approx(pooled.sd)
    assert profile.host_margin("short") == pytest.approx(profile.hosts.margin("short", own))
    assert load_profile("llama-2-7b-h100-bf16").card_spread() == CardSpread.pooled(
        [load_profile("llama-2-7b-h100-bf16").hosts])  # no other profile of its card

def test_retired_hosts_stay_on_record_and_set_no_margin(tmp_path):
    """Runs of a retired engine keep their rows and reason but leave the margins and factors to the others; a
    profile whose runs are all retired plans on its own passes. --retire-hosts writes it, naming an engine no run
    was served by, a missing reason or a profile without hosts as errors, and writing nothing then."""
    from calibration.cli import profile as profile_cmd
    from calibration.host_spread import HostSpread, MeasuredHost

    run = {"scheduler": "splitfuse", "token_budget": 768, "mix": "short", "prompt": "normal:512:0.3",
           "output": "normal:256:0.3", "num_requests": 700, "seed": 1, "temperature": 1.0, "rate": 90.0,
           "kv_total_blocks": 14000, "max_model_len": 4096}
    runs = (MeasuredHost("old", "splitfuse-768", "short", 20.0, 22.0, commit="aaa"),
            MeasuredHost("new", "splitfuse-768", "short", 20.0, 20.4, commit="bbb", run=run),
            MeasuredHost("new", "splitfuse-768", "long", 8.0, 8.08, commit="bbb"))
    spread = HostSpread(runs).retire({"aaa"}, "an engine before the loop that streams deltas")
    assert [r.retired for r in spread.runs] == ["an engine before the loop that streams deltas", "", ""]
    assert spread.margin("short") == pytest.approx(0.02) and spread.factors() == pytest.approx({"new": 1.015})
    assert spread.retire({"aaa"}, "again").runs[0].retired == spread.runs[0].retired  # the first reason stays
    gone = HostSpread(runs).retire({"aaa", "bbb"}, "old")
    assert gone.margin("short") == gone.margin() == 0 and gone.margins() == {} and "every measured run" in \
        gone.describe_margins()
    with pytest.raises(ValueError, match="say why"):
        HostSpread(runs).retire({"aaa"}, " ")
    path = load_profile("llama-2-7b").with_hosts(HostSpread(runs)).save(tmp_path / "hosts.json")
    assert load_profile(path).hosts == HostSpread(runs)  # the run travels through the file
    out = tmp_path / "retired.json"
    result = CliRunner().invoke(profile_cmd, ["--retire-hosts", str(path), "--engine", "aaa", "--because",
                                              "an older engine", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 runs retired (an older engine)" in result.output and "short 2.0%" in result.output
    assert load_profile(out).hosts == HostSpread(runs).retire({"aaa"}, "an older engine")
    result = CliRunner().invoke(profile_cmd, ["--check", str(out)])
    assert result.exit_code == 0 and "hosts: 1 measured" in result.output and "1 runs retired" in result.output
    for args, code, message in ((["--engine", "zzz", "--because", "x"], 1, "--engine zzz: no run"),
                                (["--engine", "aaa"], 1, "say why"),
                                (["--because", "x"], 2, "needs --engine COMMIT")):
        again = tmp_path / "again.json"
        result = CliRunner().invoke(profile_cmd, ["--retire-hosts", str(path), *args, "--out", str(again)])
        assert result.exit_code == code and message in result.output, result.output
        assert not again.exists()
    bare = load_profile("llama-2-7b").with_hosts(None).save(tmp_path / "bare.json")
    result = CliRunner().invoke(profile_cmd, ["--retire-hosts", str(bare), "--engine", "aaa", "--because", "x",
                                              "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 1 and "no measured hosts" in result.output
    result = CliRunner().invoke(profile_cmd, ["--check", "llama-2-7b", "--engine", "aaa"])
    assert result.exit_code == 2 and "go with --retire-hosts" in result.output


def test_host_offsets_show_a_gpus_runs_on_one_side_of_their_means():
    """Each run's offset is its log factor less its profile's mean for the mix (so they sum to 0 there); a GPU's
    mixes agree where its offsets move together; each GPU left out is judged against the margin the others set; the
    report names each card's pooled degrees of freedom."""
    from types import SimpleNamespace

    import pandas as pd
    from click.testing import CliRunner

    from calibration.host_offsets import held_out, main, mixes_agreement, models_agreement, offset_frame, typical_error
    from calibration.host_spread import CardSpread, HostSpread, MeasuredHost

    profiles = [load_profile(n) for n in ("llama-3-8b-h200-bf16", "llama-2-13b-h200-bf16")]
    offsets = offset_frame(profiles)
    assert len(offsets) == sum(len(p.hosts.active) for p in profiles)
    assert offsets.groupby(["profile", "mix"])["offset"].sum().abs().max() < 1e-12
    on_both = {r.host for r in profiles[0].hosts.active} & {r.host for r in profiles[1].hosts.active}
    assert on_both and set(models_agreement(offsets).index) == on_both
    frame = pd.DataFrame({"profile": "m", "host": [f"g{i}" for i in range(4)] * 2, "mix": ["long"] * 4 + ["short"] * 4,
                          "offset": [-2, -1, 1, 2, -4, -2, 2, 4]})
    assert mixes_agreement(frame) == (pytest.approx(1.0), 4)
    assert mixes_agreement(frame.assign(offset=[-2, -1, 1, 2, 4, 2, -2, -4]))[0] == pytest.approx(-1.0)

    def profile(model, factors):  # {gpu: factor} of one mix
        runs = tuple(MeasuredHost(g, "splitfuse-768", "long", 10.0, 10.0 * f) for g, f in factors.items())
        return SimpleNamespace(meta={"model": model, "card": "c"}, hosts=HostSpread(runs))

    card = [profile("a", {"g0": 1.00, "g1": 1.01, "g2": 0.99, "g3": 1.00}), profile("b", {"g0": 1.0, "g4": 1.3})]
    judged = held_out(card).set_index(["host", "profile"])
    without_g4 = HostSpread(card[1].hosts.runs[:1])
    assert len(judged) == 6 and judged.loc[("g4", "b"), "margin"] == pytest.approx(
        without_g4.margin("long", CardSpread.pooled([card[0].hosts, without_g4])))
    assert judged.loc[("g4", "b"), "excess"] == pytest.approx(0.3)
    assert judged.loc[("g4", "b"), "margin"] < 0.3  # a GPU far slower than the others is outside their margin
    assert judged.loc[("g4", "b"), "typical"] == pytest.approx(0.0)  # g0's run alone, at the profile's price
    assert judged.loc[("g1", "a"), "typical"] == pytest.approx((1.00 * 0.99 * 1.00) ** (1 / 3) - 1)
    swept, centred = typical_error(judged)
    excess = np.log1p(judged["excess"])
    assert swept == pytest.approx(excess.abs().mean())
    assert centred == pytest.approx((excess - np.log1p(judged["typical"])).abs().mean())
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 0, result.output
    assert "runs within the margin the other GPUs set" in result.output
    assert "on the typical host the other GPUs read" in result.output
    h200 = load_profile("llama-3-8b-h200-bf16").card_spread()
    assert f"{h200.sd:.2%}, {h200.dof} degrees of freedom" in result.output
