"""``splitfuse simulate``: the default run, the output files and a load sweep."""

import json
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli import simulate


def test_writes_requests_summary_and_report(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(simulate, ["-n", "200", "--replicas", "2", "--seed", "1", "--out", str(out),
                                           "--goodput", "ttft:1000", "tpot:100", "--warmup", "0.1"])
    assert result.exit_code == 0, result.output
    assert "effective throughput (FastGen)" in result.output and "goodput" in result.output
    df = pd.read_csv(out / "requests.csv")
    assert len(df) == 200 and set(df["replica"]) == {0, 1} and set(df["seed"]) == {1}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["requests"] == 180 and summary["options"]["replicas"] == 2
    assert summary["config"]["replicas"] == "2" and "llama-2-7b" in summary["config"]["profile"]
    html = (out / "report.html").read_text()
    assert html.count("plotly-graph-div") >= 5 and "KV cache use" in html


def test_sweep_prints_the_curve_searches_and_runs_the_sustainable_rate(tmp_path):
    result = CliRunner().invoke(simulate, ["-n", "150", "--replicas", "1", "--rates", "1,3,30",
                                           "--replications", "2", "--max-requests-per-replica", "300",
                                           "--out", str(tmp_path), "--report", "none"])
    assert result.exit_code == 0, result.output
    assert "queueing delay growth (s/s)" in result.output and "MSER-5" in result.output
    assert "sustainable rate with >= 90% of requests meeting the SLA in steady state:" in result.output
    assert "95% CI" in result.output and "intervals over 2 replications are rough" in result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    rate = summary["rate"]
    assert 1.0 <= rate < 30.0 and f"{rate:.4g} req/s" in result.output  # what ran is the answer, not the default
    assert summary["config"]["rate"].startswith(f"{rate:.4g} req/s")


def test_console_script_runs_without_torch():
    code = ("import sys; from splitfuse.cli import main; sys.argv = ['splitfuse', 'simulate', '-n', '50']; "
            "import sim.cli\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code\n"
            "assert 'torch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "profile:" in out.stdout


@pytest.mark.parametrize("profile, says", [
    ("llama-2-7b-h200-bf16",
     "temperature 0 (greedy: argmax in the graphs, decode steps enqueued ahead, as the profile prices them)"),
    ("llama-2-7b-h100-bf16", "temperature 0 (greedy, priced as sampled: the profile has no greedy section)"),
    ("mistral-7b-h200-bf16", "temperature 0 (greedy: argmax in the graphs")])
def test_greedy_requests_say_how_they_are_priced(profile, says):
    result = CliRunner().invoke(simulate, ["-n", "100", "--replicas", "1", "--profile", profile, "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert says in result.output
    refused = CliRunner().invoke(simulate, ["-n", "100", "--temperature", "-1"])
    assert refused.exit_code == 2 and "--temperature must be >= 0" in refused.output


def test_host_typical_runs_on_the_cards_recorded_hosts():
    from calibration.profile import load_profile

    args = ["-n", "50", "--replicas", "1", "--profile", "mistral-7b-h200-bf16", "--scheduler", "splitfuse",
            "--token-budget", "2048"]
    swept = CliRunner().invoke(simulate, args)
    typical = CliRunner().invoke(simulate, [*args, "--host-typical"])
    assert swept.exit_code == 0 and typical.exit_code == 0, swept.output + typical.output
    factor = load_profile("mistral-7b-h200-bf16").host_typical("long", "splitfuse-2048")
    assert factor > 1.01 and f"passes {factor:.4g} x the profile's price" in typical.output
    assert "host:" not in swept.output

    def capacity(output):
        line = next(line for line in output.splitlines() if line.startswith("rate:"))
        return float(line.split("estimated capacity ")[1].split()[0])

    assert capacity(swept.output) / factor * 0.99 < capacity(typical.output) < capacity(swept.output)
    refused = CliRunner().invoke(simulate, ["-n", "50", "--profile", "builtin-llama-2-7b", "--host-typical"])
    assert refused.exit_code == 2 and "a typical host needs a measured profile" in refused.output
