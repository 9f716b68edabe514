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
    assert len(simulate(read_trace(csv), ClusterConfig(COST, replicas=1), seed=0).requests) == 2


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
        simulate(Workload(num_requests=5, rate=1.0),
                 ClusterConfig(COST, replicas=1, policy=PolicyConfig(token_budget=0)))
    result = CliRunner().invoke(simulate_cli, ["--token-budget", "0", "--profile", "builtin-llama-2-7b"])
    assert result.exit_code == 2 and "--token-budget" in result.output


def test_prompt_longer_than_the_kv_cache_names_the_row():
    w = Workload(num_requests=50, rate=1.0, prompt=LengthDist("uniform", (10, 3000)), output=LengthDist("fixed", (1,)))
    with pytest.raises(ValueError, match=r"request row \d+ \(prompt \d+.*100 blocks of 16"):
        simulate(w, ClusterConfig(COST, replicas=1), seed=0)


def test_a_pass_priced_below_zero_stops_the_run_naming_the_pass():
    """A fit taken past the passes it was swept on can go negative there: SimPy would say only 'Negative delay'."""
    cost = LinearCost(base=0.01, per_token=-1e-4, num_kv_blocks=100, max_model_len=4096)
    w = Workload(num_requests=5, rate=1.0, prompt=LengthDist("fixed", (300,)), output=LengthDist("fixed", (2,)))
    with pytest.raises(ValueError, match=r"replica 0: .* a pass of 300 tokens \(300 of 1 prompts, 0 decodes\) at "
                                         r"-0.02 s; .*sweep passes like this one"):
        simulate(w, ClusterConfig(cost, replicas=1), seed=0)


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


# -- what a new user ran into (issue 19) ---------------------------------------------------------------------
TRACE = "arrival_time,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n1.0,50,5\n"


def test_trace_alone_replays_the_trace(tmp_path):
    """Before, --trace without --arrivals trace was ignored and 2,000 Poisson requests ran."""
    path = write(tmp_path, "t.csv", TRACE)
    out = tmp_path / "run"
    result = CliRunner().invoke(simulate_cli, ["--trace", str(path), "--replicas", "1", "--out", str(out),
                                               "--report", "none"])
    assert result.exit_code == 0, result.output
    assert "3 requests over 1 s" in result.output
    import pandas as pd

    assert sorted(pd.read_csv(out / "requests.csv")["prompt_tokens"]) == [50, 100, 200]
    assert Workload(trace=str(path)).arrivals == "trace"


@pytest.mark.parametrize("flag", [["--rate", "5"], ["-n", "10"], ["--prompt-len", "fixed:10"],
                                  ["--arrivals", "poisson"]])
def test_trace_with_a_sampling_flag_says_which_flag_it_would_ignore(tmp_path, flag):
    path = write(tmp_path, "t.csv", TRACE)
    result = CliRunner().invoke(simulate_cli, ["--trace", str(path), *flag])
    assert result.exit_code == 2 and flag[0] in result.output and "trace" in result.output


def test_capacity_estimate_uses_the_traces_lengths(tmp_path):
    """Before, a trace run's capacity estimate came from the default ~2,600-token prompts."""
    from sim.saturation import estimate_capacity

    short = "arrival_time,prompt_tokens,output_tokens\n" + "".join(f"{i},100,10\n" for i in range(20))
    config = ClusterConfig("llama-2-7b", replicas=1)
    traced = estimate_capacity(config, Workload(trace=str(write(tmp_path, "s.csv", short))))
    sampled = estimate_capacity(config, Workload(prompt="fixed:100", output="fixed:10"))
    assert traced == pytest.approx(sampled) and traced > 5 * estimate_capacity(config, Workload())


@pytest.mark.parametrize("header", ["arrived_at,num_prefill_tokens,num_decode_tokens",  # Vidur
                                    "Timestamp,Request tokens,Response tokens",  # BurstGPT, as vLLM replays it
                                    "timestamp,input_len,output_len"])  # vLLM's per-request names
def test_vidur_and_vllm_trace_columns_are_read(tmp_path, header):
    table = read_trace(write(tmp_path, "t.csv", f"{header}\n0.25,300,30\n0.0,100,10\n"))
    assert list(table.arrivals) == [0.0, 0.25] and list(table.prompt_tokens) == [100, 300]
    assert list(table.output_tokens) == [10, 30] and list(table.lines) == [3, 2]


def test_a_request_that_cannot_fit_is_named_by_its_trace_line(tmp_path):
    text = "arrival_time,prompt_tokens,output_tokens\n0,10,5\n\n1,3000,5\n"
    with pytest.raises(ValueError, match="trace line 4 "):
        simulate(read_trace(write(tmp_path, "t.csv", text)), ClusterConfig(COST, replicas=1))


def test_length_file_errors_name_the_file_line(tmp_path):
    """Before, row numbers in these errors counted data rows (the header and blank lines shifted them)."""
    path = write(tmp_path, "lengths.csv", "prompt\n10\n\n20\nx\n")
    with pytest.raises(ValueError, match="line 5: prompt = 'x'"):
        parse_length(f"file:{path}:prompt")
    good = write(tmp_path, "good.csv", "prompt\n10\n\n20\n")
    dist = parse_length(f"file:{good}:prompt")
    assert list(dist.args[2]) == [10, 20] and str(dist) == f"file:{good}:prompt"


def test_large_counts_print_without_exponent():
    """Before, the summary printed 'requests 1e+04'."""
    from sim.units import format_value

    assert format_value("requests", 10000) == "10,000 requests"
    assert format_value("token_throughput_tps", 123456.7) == "123,457 tokens/s"
    assert format_value("sla_share", 0.9731) == "97.3%" and format_value("ttft_p95", 0.52314) == "0.5231 s"
    result = CliRunner().invoke(simulate_cli, ["-n", "300", "--replicas", "1", "--report", "none"])
    assert result.exit_code == 0 and "e+0" not in result.output and "300 requests" in result.output


def test_every_summary_key_has_a_unit():
    from sim.metrics import SLA, summarize
    from sim.units import describe

    w = Workload(num_requests=40, rate=2.0, prompt="fixed:100", output="fixed:8")
    summary = summarize(simulate(w, ClusterConfig(COST, replicas=1)), SLA(goodput={"ttft": 1.0}))
    assert all(describe(key)[1] or key == "seed" for key in summary)
    with pytest.raises(KeyError, match="sim/units.py"):
        describe("brand_new_metric")


def test_prefill_first_accepts_outputs_cut_at_the_context():
    """A prompt near the context with a long nominal output is cut at the context, as the engine serves it: its
    longest pass after a preemption is prompt + what fits - 1, which the budget need only cover."""
    workload = Workload(num_requests=3, rate=1.0, prompt=LengthDist("fixed", (4000,)),
                        output=LengthDist("fixed", (335,)))
    cost = LinearCost(base=0.01, per_token=1e-5, num_kv_blocks=1000, max_model_len=4096)
    policy = PolicyConfig(scheduler="prefill-first", max_num_batched_tokens=4224)
    result = simulate(workload, ClusterConfig(cost, replicas=1, policy=policy))
    assert (result.columns["output_tokens"] == 96).all()
    with pytest.raises(ValueError, match="too small for prefill-first"):
        simulate(workload, ClusterConfig(cost, replicas=1, policy=PolicyConfig(scheduler="prefill-first",
                                                                               max_num_batched_tokens=4000)))
