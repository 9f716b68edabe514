"""``splitfuse plan``: the cheapest fleet that meets the SLA, checked whole, with intervals; prices with sources."""

import dataclasses
import json

import pandas as pd
import pytest
from click.testing import CliRunner

from calibration.profile import load_profile
from sim.plan import Fleet, PlanConfig, ReplicaCapacity, cheapest_mix, fleets, load_prices
from sim.plan_cli import plan

PRICES = pd.DataFrame({"card": ["A", "B"], "gpus_per_replica": [1, 1], "usd_per_gpu_hour": [3.0, 4.0],
                       "source": ["s", "s"], "as_of": ["x", "x"]}, index=pd.Index(["a", "b"], name="profile"))


def capacity(profile, rate):
    return ReplicaCapacity(profile, "splitfuse", 768, rate, 0.9 * rate, 1.5 * rate, 1.6 * rate, (0.95, 1.05))


def test_fleets_are_sized_priced_and_ranked_with_mixes_of_two_cards():
    """A at 3 USD/h sustains 6 req/s, B at 4 USD/h 9 req/s: for 20 req/s, 4 x A = 12 USD/h, 3 x B = 12 USD/h,
    and the mix 2 x A + 1 x B (21 req/s) = 10 USD/h is the cheapest."""
    caps = [capacity("a", 6.0), capacity("b", 9.0)]
    assert cheapest_mix(caps[0], caps[1], 20.0, PRICES)[0] == {"a": 2, "b": 1}
    ranked = fleets(caps, PlanConfig(20.0, ("a", "b"), balancers=("round-robin", "least-requests"), host_margin=0),
                    PRICES)
    assert [f.usd_per_hour for f in ranked] == sorted(f.usd_per_hour for f in ranked)
    assert ranked[0].counts == {"a": 2, "b": 1} and ranked[0].usd_per_hour == 10.0
    assert {f.balancer for f in ranked[:2]} == {"round-robin", "least-requests"}
    one_card = next(f for f in ranked if f.counts == {"a": 4})
    assert (one_card.replicas_low, one_card.replicas_high) == (3, 4)  # 20 req/s over 9 and over 5.4 req/s each


def test_a_mixed_fleet_interleaves_its_cards():
    fleet = Fleet({"llama-2-7b-h100-bf16": 2, "llama-2-7b-h200-bf16": 1}, "splitfuse", 768, "round-robin", 10.0, 3, 3)
    cards = [c.meta["card"] for c in fleet.cluster().costs()]
    assert cards[0] == cards[2] != cards[1]


def test_prices_need_a_price_and_a_source(tmp_path):
    bad = tmp_path / "prices.csv"
    bad.write_text("profile,card,gpus_per_replica,usd_per_gpu_hour,source,as_of\nx,X,1,0,,2026\n")
    with pytest.raises(ValueError, match="line 2"):
        load_prices(bad)
    assert (load_prices()["source"].str.len() > 0).all()


def test_plan_answers_a_small_target_and_its_pick_meets_at_the_check(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(plan, ["--rate", "12", "--replications", "2", "--max-requests-per-replica", "400",
                                       "--fit-resamples", "2", "--check-replications", "2",
                                       "--check-requests-per-replica", "60", "--processes", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "cheapest fleet meeting the SLA" in result.output and "intervals over 2 replications" in result.output
    table = pd.read_csv(out / "plan.csv")
    assert list(table["cost (USD/h)"]) == sorted(table["cost (USD/h)"])
    picked = table[table["check"] == "meets"]
    assert len(picked) == 1 and (table.loc[:picked.index[0], "check"].iloc[:-1] != "meets").all()
    assert "cost (USD/h)" in table and "rate per replica (req/s)" in table
    summary = json.loads((out / "plan.json").read_text())
    # the shipped profiles' margins for the long mix, per scheduler
    margins = {p: m["splitfuse-768"] for p, m in summary["options"]["host_margins"].items()}
    assert summary["options"]["host_mix"] == "long"
    assert margins == {p: pytest.approx(load_profile(p).host_margin("long", "splitfuse-768")) for p in margins}
    assert summary["pick"]["host_factors"] == {p: 1 + margins[p] for p in summary["pick"]["counts"]}
    assert any(margins.values()) and "its measured hosts of the long mix" in result.output
    caps = summary["capacities"]
    assert all(c["low"] <= c["rate"] <= (c["high"] or float("inf")) for c in caps)
    html = (out / "plan.html").read_text()
    assert html.count("plotly-graph-div") >= 3 and "cost (USD/h)" in html


def test_a_workload_names_the_mix_it_draws():
    """The plan's margin follows the workload's named mix: the same lengths name it, other lengths and traces none."""
    from sim.workload import MIXES, Workload, mix_name

    assert mix_name(Workload()) == "long" and mix_name(Workload(prompt=MIXES["short"][0], output=MIXES["short"][1]))
    assert mix_name(Workload(prompt="normal:2600:0.3", output="normal:60:0.3")) == "fastgen"
    assert mix_name(Workload(prompt="normal:2600:0.2")) is None
    assert mix_name(Workload(trace="t.csv")) is None


def test_a_slower_host_takes_longer_per_pass_and_sustains_less():
    """``SlowerHost`` stretches every pass (heat included) and nothing else, so a replica sustains less."""
    from engine.policy import PolicyConfig, plan_features
    from engine.policy.plan import BatchPlan
    from sim.cluster import ClusterConfig
    from sim.costs import SlowerHost, load_cost_model
    from sim.saturation import estimate_capacity
    from sim.workload import Workload

    profile = load_cost_model("llama-2-7b-h200-bf16")
    slow = SlowerHost(profile, 1.05)
    f = plan_features(BatchPlan(num_new_tokens=[1, 500], start_positions=[300, 0], samples=[True, True],
                                num_decodes=1, num_prefill_tokens=500))
    assert slow.predict(f, 0.6) == pytest.approx(1.05 * profile.predict(f, 0.6))
    assert profile.predict(f, 0.6) > profile.predict(f, 0.0)  # the heat reaches the profile
    assert slow.new_heat() is not None and slow.meta["host_factor"] == 1.05
    assert (slow.num_kv_blocks, slow.delivery_seconds(8)) == (profile.num_kv_blocks, profile.delivery_seconds(8))
    one = estimate_capacity(ClusterConfig(profile, 1, PolicyConfig()), Workload())
    assert estimate_capacity(ClusterConfig(slow, 1, PolicyConfig()), Workload()) == pytest.approx(one / 1.05, rel=0.01)
    with pytest.raises(ValueError, match="positive"):
        SlowerHost(profile, 0.0)


def test_a_slower_host_can_slow_each_serving_path_apart():
    """Factors per path slow only the passes of their path, on top of the host's factor; they need a profile."""
    from engine.policy import plan_features
    from engine.policy.plan import BatchPlan
    from sim.costs import SlowerHost, builtin_llama_2_7b, load_cost_model

    profile = load_cost_model("llama-2-7b-h200-bf16")
    slow = SlowerHost(profile, 1.01, path_factors={"mixed-graph": 1.1})
    mixed = plan_features(BatchPlan(num_new_tokens=[1, 500], start_positions=[300, 0], samples=[True, True],
                                    num_decodes=1, num_prefill_tokens=500))
    decode = plan_features(BatchPlan(num_new_tokens=[1] * 8, start_positions=[300] * 8, samples=[True] * 8,
                                     num_decodes=8))
    assert [profile.scale_path(mixed), profile.scale_path(decode)] == ["mixed-graph", "decode-graph"]
    assert slow.predict(mixed, 0.3) == pytest.approx(1.01 * 1.1 * profile.predict(mixed, 0.3))
    assert slow.predict(decode, 0.3) == pytest.approx(1.01 * profile.predict(decode, 0.3))
    assert slow.meta["host_path_factors"] == {"mixed-graph": 1.1}
    with pytest.raises(ValueError, match="path 'eager'"):
        SlowerHost(profile, path_factors={"eager": float("nan")})
    with pytest.raises(ValueError, match="measured profile"):
        SlowerHost(builtin_llama_2_7b(), path_factors={"eager": 1.1})


def test_a_host_margin_plans_every_replica_on_a_slower_host():
    caps = [capacity("llama-2-7b-h100-bf16", 6.0)]
    prices = PRICES.rename(index={"a": "llama-2-7b-h100-bf16"})
    fleet = fleets(caps, PlanConfig(12.0, ("llama-2-7b-h100-bf16",), mixed=False, host_margin=0.04), prices)[0]
    assert fleet.host_factors == {"llama-2-7b-h100-bf16": 1.04}
    assert all(c.factor == 1.04 for c in fleet.cluster().costs())
    assert all(not hasattr(c, "factor") for c in dataclasses.replace(fleet, host_factors={}).cluster().costs())
    with pytest.raises(ValueError, match="--host-margin"):
        PlanConfig(12.0, ("a",), host_margin=-0.1)
    result = CliRunner().invoke(plan, ["--rate", "12", "--host-margin", "1.5"])
    assert result.exit_code == 2 and "--host-margin must be a share" in result.output


def test_by_default_each_profile_is_planned_on_its_slowest_measured_run_of_the_mix(tmp_path):
    """Without --host-margin a profile's replicas run as slow as its slowest measured run of the workload's mix (its
    "hosts" section), of any mix where the workload is none of the named ones; one without measured hosts runs as
    priced, and --host-margin 0 plans every profile as priced."""
    from calibration.host_spread import HostSpread, MeasuredHost

    runs = tuple(MeasuredHost(host, "splitfuse-768", mix, served, simulated)
                 for host, mix, served, simulated in (("h1", "long", 8.0, 8.2), ("h1", "short", 20, 20.2),
                                                      ("h2", "long", 8.5, 8.4)))
    alone = load_profile("llama-2-7b-h200-bf16").with_hosts(HostSpread(runs))
    alone.meta["card"] = "a card of its own"  # no other profile's hosts to pool, one degree of freedom: no bound
    measured = str(alone.save(tmp_path / "m.json"))
    plain = str(load_profile("llama-2-7b-h100-bf16").with_hosts(None).save(tmp_path / "plain.json"))
    h1 = 8.2 / 8.0  # the slowest run of the long mix (and of any)
    config = PlanConfig(12.0, (measured, plain), mix="long")
    assert config.margin(measured) == pytest.approx(h1 - 1) and config.margin(plain) == 0
    assert PlanConfig(12.0, (measured,), mix="short").margin(measured) == pytest.approx(0.01)
    assert PlanConfig(12.0, (measured,)).margin(measured) == pytest.approx(h1 - 1)  # no named mix: any run
    assert PlanConfig(12.0, (measured,), host_margin=0).margin(measured) == 0
    prices = PRICES.rename(index={"a": measured, "b": plain})
    fleet = next(f for f in fleets([capacity(measured, 6.0), capacity(plain, 5.0)], config, prices)
                 if len(f.counts) == 2)
    assert fleet.host_factors == pytest.approx({measured: h1, plain: 1.0})
    factors = sorted(getattr(c, "factor", 1.0) for c in fleet.cluster().costs())
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(h1)


def test_a_scheduler_measured_slower_is_planned_with_its_own_margin(tmp_path):
    """A mix's runs of the candidate's scheduler set its margin where there are some; a scheduler never measured
    takes the mix's worst run. llama-3-8b's budget-512 runs of the long mix ran 6-15% slower than simulated where
    its budget-768 runs kept up (calibration/VALIDATION.md, fifty-sixth round)."""
    from calibration.host_spread import HostSpread, MeasuredHost

    runs = (MeasuredHost("a", "splitfuse-768", "long", 8.0, 8.2), MeasuredHost("b", "splitfuse-512", "long", 8.0, 9.0))
    path = str(load_profile("llama-2-7b").with_hosts(HostSpread(runs)).save(tmp_path / "hosts.json"))
    config = PlanConfig(target_rate=10, profiles=(path,), mix="long")
    own_512, own_768 = config.margin(path, "splitfuse", 512), config.margin(path, "splitfuse", 768)
    assert own_512 >= 0.125 and own_768 < own_512 and config.margin(path, "prefill-first", 4352) >= 0.125
    assert config.margin(path) == config.margin(path, "prefill-first", 4352)  # no scheduler named: the mix's runs
    assert PlanConfig(target_rate=10, profiles=(path,), mix="long", host_margin=0.03).margin(path, "splitfuse",
                                                                                          512) == 0.03
