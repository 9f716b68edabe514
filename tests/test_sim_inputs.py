"""Bad input gives a clear error naming the row or the flag."""

import pytest
from click.testing import CliRunner

from engine.policy import PolicyConfig
from sim.cli import simulate as simulate_cli
from sim.cluster import ClusterConfig, simulate
from sim.costs import LinearCost
from sim.workload import LengthDist, Workload, parse_length, read_trace

COST = LinearCost(base=0.01, per_token=1e-5, num_kv_blocks=100, max_model_len=4096)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trace_replay_reads_csv_and_jsonl(tmp_path):
    csv = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens,prefix_id,prefix_len\n"
                                   "0.5,100,10,sys,64\n0.1,50,5,,\n")
    table = read_trace(csv)
    assert list(table.arrivals) == [0.1, 0.5] and list(table.prompt_tokens) == [50, 100]
    assert list(table.prefix_ids) == [None, "sys"] and list(table.prefix_lens) == [0, 64]
    jsonl = write(tmp_path, "t.jsonl", '{"arrival_time": 0, "prompt_tokens": 7, "output_tokens": 3}\n')
    assert list(read_trace(jsonl).output_tokens) == [3]
    assert len(simulate(read_trace(csv), ClusterConfig(COST), seed=0).requests) == 2


@pytest.mark.parametrize("text, line, words", [
    ("arrival_time,prompt_tokens,output_tokens\n0,10,5\n1,ten,5\n", 3, "integers"),
    ("arrival_time,prompt_tokens,output_tokens\n0,10,5\n1,10\n", 3, "2 fields"),
    ("arrival_time,prompt_tokens,output_tokens\n0,10,5\n\n-1,10,5\n", 4, ">= 0"),
    ("arrival_time,prompt_tokens\n0,10\n", 2, "missing output_tokens"),
    ("arrival_time,prompt_tokens,output_tokens\n0,0,5\n", 2, ">= 1"),
])
def test_malformed_csv_row_is_named(tmp_path, text, line, words):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(ValueError, match=f"line {line}: .*{words}"):
        read_trace(path)


def test_malformed_jsonl_line_is_named(tmp_path):
    path = write(tmp_path, "bad.jsonl", '{"arrival_time": 0, "prompt_tokens": 7, "output_tokens": 3}\n{oops\n')
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        read_trace(path)


def test_negative_rate_names_the_flag():
    with pytest.raises(ValueError, match="--rate"):
        Workload(rate=-1.0).generate(0)
    result = CliRunner().invoke(simulate_cli, ["--rate", "-2", "--profile", "builtin-llama-2-7b"])
    assert result.exit_code == 2 and "--rate" in result.output


def test_token_budget_below_one_names_the_flag():
    with pytest.raises(ValueError, match="--token-budget"):
        simulate(Workload(num_requests=5, rate=1.0), ClusterConfig(COST, policy=PolicyConfig(token_budget=0)))
    result = CliRunner().invoke(simulate_cli, ["--token-budget", "0", "--profile", "builtin-llama-2-7b"])
    assert result.exit_code == 2 and "--token-budget" in result.output


def test_prompt_longer_than_the_kv_cache_names_the_row():
    w = Workload(num_requests=50, rate=1.0, prompt=LengthDist("uniform", (10, 3000)), output=LengthDist("fixed", (1,)))
    with pytest.raises(ValueError, match=r"request row \d+ \(prompt \d+.*100 blocks of 16"):
        simulate(w, ClusterConfig(COST), seed=0)


def test_unknown_profile_lists_the_shipped_ones():
    result = CliRunner().invoke(simulate_cli, ["--profile", "gpt-9-on-a-toaster"])
    assert result.exit_code == 2
    assert "--profile" in result.output and "gpt-9-on-a-toaster" in result.output and "shipped" in result.output


@pytest.mark.parametrize("spec", ["normal:2600", "gauss:1:2", "uniform:5:1", "fixed:0", "normal:x:0.3"])
def test_bad_length_spec_names_the_flag(spec):
    with pytest.raises(ValueError, match="--output-len"):
        parse_length(spec, "--output-len")


def test_unknown_balancer_and_scheduler_name_the_choices():
    for flag, words in (("--balancer", "power-of-two"), ("--scheduler", "prefill-first")):
        result = CliRunner().invoke(simulate_cli, [flag, "nope", "--profile", "builtin-llama-2-7b"])
        assert result.exit_code == 2 and words in result.output
