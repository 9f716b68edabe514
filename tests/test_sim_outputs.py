"""``requests.csv`` lets a reader recompute the summary; token times come as parquet on request."""

import json
import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli import simulate as simulate_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    result = CliRunner().invoke(simulate_cli, ["-n", "300", "--replicas", "2", "--replications", "2", "--rate", "14",
                                               "--warmup", "0.1", "--out", str(out), "--report", "none",
                                               "--token-times", "--goodput", "e2el:3000"])
    assert result.exit_code == 0, result.output
    return out, pd.read_csv(out / "requests.csv"), json.loads((out / "summary.json").read_text())


def test_requests_csv_recomputes_every_latency_and_sla_share_of_the_summary(run):
    """Before, requests.csv held raw times only: TTFT, TPOT, e2e and the SLA statistic could not be audited."""
    _, df, summary = run
    for seed, s in zip((0, 1), summary["runs"]):
        m = df[(df.seed == seed) & df.measured]
        assert len(m) == s["requests"] == 270
        for metric in ("ttft", "tpot", "e2e"):
            assert np.percentile(m[f"{metric}_s"].dropna(), 95) == pytest.approx(s[f"{metric}_p95"])
        assert (m.ttft_s == m.first_token_s - m.arrival_s).all() and (m.e2e_s == m.finish_s - m.arrival_s).all()
        for rate in (1, 2, 3, 4, 6, 8):
            assert m[f"meets_sla@{rate}"].mean() == pytest.approx(s[f"sla_share@{rate}"])
            # the verdict is the prompt SLA and the EWM gap statistic against 1 / rate, as documented
            assert (m[f"meets_sla@{rate}"] == (m.ttft_s <= m.prompt_sla_s) & (m.max_ewm_gap_s < 1 / rate)).all()
        assert m.meets_goodput.mean() == pytest.approx(s["goodput_share"])


def test_token_times_parquet_holds_every_token(run):
    out, df, _ = run
    times = pd.read_parquet(out / "token_times.parquet")
    assert list(times.columns) == ["id", "token", "time", "seed"]
    counts = times.groupby(["seed", "id"]).size()
    assert (counts.to_numpy() == df.set_index(["seed", "id"]).loc[counts.index, "output_tokens"].to_numpy()).all()
    first = times[times.token == 0].set_index(["seed", "id"])["time"]
    assert np.allclose(first, df.set_index(["seed", "id"]).loc[first.index, "first_token_s"])


def test_token_times_without_pyarrow_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes ``import pyarrow`` fail
    result = CliRunner().invoke(simulate_cli, ["-n", "10", "--out", str(tmp_path), "--token-times"])
    assert result.exit_code == 2 and "pip install pyarrow" in result.output
    result = CliRunner().invoke(simulate_cli, ["-n", "10", "--token-times"])
    assert result.exit_code == 2 and "--out" in result.output
