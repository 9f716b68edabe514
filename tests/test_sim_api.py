"""The Python API takes what ``splitfuse simulate`` takes, with the same defaults, and gives the same run."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from engine.policy import PolicyConfig
from sim.cli import simulate as simulate_cli
from sim.cluster import ClusterConfig, simulate
from sim.metrics import summarize
from sim.workload import FASTGEN_MAX_PROMPT_TOKENS, LengthDist, Workload


def test_workload_takes_length_specs_and_cluster_takes_profile_names():
    w = Workload(num_requests=20, rate=2.0, prompt="normal:2600:0.3", output="fixed:64")
    assert w.prompt == LengthDist("normal", (2600.0, 0.3)) and w.output == LengthDist("fixed", (64.0,))
    assert str(w.prompt) == "normal:2600:0.3"
    config = ClusterConfig("llama-2-7b", replicas=2)
    assert config.cost.meta["model"] == "llama-2-7b" and config.cost.meta["kind"] == "measured"
    assert len(simulate(w, config, seed=0).requests) == 20
    with pytest.raises(ValueError, match="--prompt-len"):
        Workload(prompt="normal:2600")
    with pytest.raises(ValueError, match="--profile.*gpt-9"):
        ClusterConfig("gpt-9")


def test_api_clips_prompts_at_4000_tokens_as_the_cli_does():
    # Before, Workload did not clip and this run failed on a 4,684-token prompt the profile cannot hold.
    w = Workload(num_requests=500, rate=10)
    table = w.generate(0)
    assert table.prompt_tokens.max() == FASTGEN_MAX_PROMPT_TOKENS == 4000
    assert len(simulate(w, ClusterConfig("llama-2-7b"), seed=0).requests) == 500


def test_defaults_are_the_commands(tmp_path):
    result = CliRunner().invoke(simulate_cli, ["--out", str(tmp_path), "--report", "none"])
    assert result.exit_code == 0, result.output
    from_cli = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    from_api = summarize(simulate(Workload(), ClusterConfig()))
    assert from_api == pytest.approx(from_cli, nan_ok=True)
    assert from_api["requests"] == 2000 and ClusterConfig().replicas == 4 == len(ClusterConfig().costs())


def test_without_a_rate_the_api_runs_at_the_commands_load():
    config = ClusterConfig("llama-2-7b", replicas=2, policy=PolicyConfig(balancer="round-robin"))
    result = simulate(Workload(num_requests=50), config)
    from sim.saturation import estimate_capacity

    assert result.meta["workload"].rate == pytest.approx(0.8 * estimate_capacity(config, Workload()))
    with pytest.raises(ValueError, match="--load"):
        simulate(Workload(num_requests=5, load=0), config)


def test_progress_is_a_widget_in_jupyter():
    """Inside a kernel, ``progress=True`` shows tqdm's notebook widget (tqdm.auto), not text on stderr."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipywidgets")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from sim.cluster import ClusterConfig, simulate\nfrom sim.workload import Workload\n"
        "r = simulate(Workload(num_requests=50, rate=5.0), ClusterConfig('llama-2-7b', replicas=1), progress=True)")])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs), outputs
    assert not any(o.get("name") == "stderr" and "req/s" in o.get("text", "") for o in outputs)


def test_token_times_are_kept_on_request():
    w = Workload(num_requests=30, rate=3.0, prompt="fixed:100", output="uniform:1:20")
    result = simulate(w, ClusterConfig("llama-2-7b", replicas=2), seed=0, token_times=True)
    times = result.token_times
    per_request = times.groupby("id")
    assert (per_request.size() == result.requests.set_index("id")["output_tokens"]).all()
    assert np.allclose(per_request["time"].first(), result.requests.set_index("id")["first_token"])
    assert np.allclose(per_request["time"].last(), result.requests.set_index("id")["finish"])
    with pytest.raises(ValueError, match="token_times=True"):
        _ = simulate(w, ClusterConfig("llama-2-7b", replicas=1), seed=0).token_times
