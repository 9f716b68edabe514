"""``benchmarks.plan_check_gpu`` on the CPU: the tiny model served at two rates, each run simulated on the same
requests and judged alike (the GPU run serves a real model at the plan's rates)."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from benchmarks.plan_check_gpu import parse_sla, rates_to_run
from calibration.profile import load_profile

PLAN = {"profile": "llama-2-7b-h200-bf16", "scheduler": "splitfuse", "token_budget": 768,
        "mix": ["tiny", "uniform:8:40", "fixed:5"], "target": 0.9, "margin": 0.05, "replications": 5,
        "max_requests_per_replica": 4000,
        "slas": {"fastgen": {"plan": 2.0, "plan_misses_at": 4.0, "typical": 2.01, "typical_misses_at": None},
                 "goodput=ttft:1000 tpot:25": {"plan": 4.0, "plan_misses_at": None, "typical": None,
                                                "typical_misses_at": None}}}


def test_the_plans_answers_are_served_once_each_and_slas_are_named():
    assert rates_to_run(PLAN) == [2.0, 4.0]  # 2.01 is within 1% of 2.0: served as one rate
    name, sla, column = parse_sla("goodput=ttft:200 tpot:20")
    assert column == "goodput_share" and sla.goodput == {"ttft": 0.2, "tpot": 0.02}
    assert parse_sla("fastgen")[2] == "sla_share"
    for bad in ("goodput", "slo=ttft:200", "goodput=ttft:0.2,tpot:0.02"):
        with pytest.raises(ValueError, match="goodput"):
            parse_sla(bad)


def test_wrong_files_and_rates_are_named(tmp_path):
    base = [sys.executable, "-m", "benchmarks.plan_check_gpu"]
    (tmp_path / "bad.json").write_text("{}")
    for args, message in ((["run", "tiny-llama", "--rates-from", str(tmp_path / "none.json"), "--out", str(tmp_path)],
                           "not a plan step's plan_rates.json"),
                          (["run", "tiny-llama", "--rates-from", str(tmp_path / "bad.json"), "--out", str(tmp_path)],
                           "not a plan step's plan_rates.json"),
                          (["compare", "--from", str(tmp_path)], "no measured.json.gz there")):
        done = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_the_plan_step_answers_on_both_hosts(tmp_path):
    """The search's answers per SLA on the plan's host (the profile's slowest run of the mix) and a typical one."""
    out = tmp_path / "plan_rates.json"
    cmd = [sys.executable, "-m", "benchmarks.plan_check_gpu", "plan", "--profile", "llama-2-7b-h200-bf16", "--mix",
           "long", "--sla", "fastgen", "--replications", "2", "--max-requests-per-replica", "400", "--processes", "1",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(out.read_text())
    assert plan["margin"] == pytest.approx(load_profile("llama-2-7b-h200-bf16").host_margin("long", "splitfuse-768"))
    answers = plan["slas"]["fastgen"]
    assert 0 < answers["plan"] <= answers["typical"] < answers["typical_misses_at"]  # a slower host sustains less
    assert rates_to_run(plan)[0] == round(answers["plan"], 3) and plan["meta"]["card"] == "cpu"


def test_a_served_run_is_judged_beside_its_simulation(tmp_path):
    plan = tmp_path / "plan_rates.json"
    plan.write_text(json.dumps(PLAN))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "benchmarks.plan_check_gpu", "run", "tiny-llama", "--rates-from", str(plan),
           "--requests", "20", "--device", "cpu", "--num-kv-blocks", "256", "--client-processes", "2",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = pd.read_csv(out / "plan_check.csv")
    assert len(frame) == 2 * 2 * 3  # rates x SLAs x (measured, simulated on two hosts)
    assert set(frame.source) == {"measured", "sim, typical host", "sim, plan host"}
    assert (frame.requests == 20).all() and frame.share.between(0, 1).all()
    labels = frame.set_index(["sla", "rate_rps"]).plan_answer.fillna("").groupby(level=[0, 1]).first()
    assert labels["fastgen", 2.0] == "plan, typical" and labels["fastgen", 4.0] == "plan misses"
    assert labels["goodput=ttft:1000 tpot:25", 4.0] == "plan"
    result = json.loads((out / "plan_check_gpu_cpu.json").read_text())
    assert result["meta"]["card"] == "cpu" and len(result["rows"]) == len(frame)
    # the plan's host runs slower: on the same requests its simulated latencies are no shorter
    sims = frame[frame.sla == "fastgen"].pivot_table(index="rate_rps", columns="source", values="tpot_p90_s")
    assert (sims["sim, plan host"] >= sims["sim, typical host"]).all()
    again = subprocess.run([sys.executable, "-m", "benchmarks.plan_check_gpu", "compare", "--from", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    pd.testing.assert_frame_equal(pd.read_csv(out / "plan_check.csv"), frame)  # simulations are seeded
