"""The sweep end to end on the CPU (tiny model, a handful of small passes): points, resume, refit, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from calibration import plans  # noqa: E402
from calibration.cli import profile as profile_cmd  # noqa: E402
from calibration.sweep import read_points, run_sweep  # noqa: E402
from engine.policy import plan_features  # noqa: E402

SPECS = [plans.PassSpec("prefill", chunks=((0, n, 0),)) for n in (3, 17, 40, 64, 100)]
SPECS += [plans.PassSpec("decode", decode_contexts=(c,) * b) for b, c in ((1, 20), (4, 33), (6, 70), (9, 17), (2, 90))]
SPECS += [plans.PassSpec("mixed", decode_contexts=(30, 50), chunks=((16, 12, 5),)),
          plans.PassSpec("mixed", decode_contexts=(40,) * 3, chunks=((0, 7, 0), (32, 9, 3)))]


def _sweep(path, specs):
    return run_sweep("tiny-llama", "fp32", path, device="cpu", progress=False, specs=specs)


def test_sweep_measures_resumes_and_refits(tmp_path):
    path = tmp_path / "p.points.jsonl"
    header, points = _sweep(path, SPECS[:4])
    assert header["kind"] == "measured" and header["model"] == "tiny-llama" and header["num_kv_blocks"] > 0
    assert [p["key"] for p in points] == [s.key for s in SPECS[:4]]
    assert header["mixed_graph_buckets"] == []  # no CUDA graphs on the CPU
    for p, s in zip(points, SPECS):
        assert {k: p[k] for k in plan_features(s)._fields} == plan_features(s)._asdict()
        assert p["graph_tokens"] is None
        assert p["wall_s"] >= p["run_s"] > 0 and len(p["wall_repeats"]) >= 3
    lines_before = len(path.read_text().splitlines())
    _, points = _sweep(path, SPECS)  # resumes: only the new passes are measured
    assert len(points) == len(SPECS)
    assert len(path.read_text().splitlines()) == lines_before + len(SPECS) - 4
    _, points = run_sweep("tiny-llama", "fp32", path, device="cpu", progress=False, specs=SPECS[:2], rounds=2)
    first = next(p for p in points if p["key"] == SPECS[0].key)
    assert first["rounds"] == 2 and len(first["wall_repeats"]) >= 6 and len(points) == len(SPECS)
    with path.open("a") as f:
        f.write('{"sweep": "decode", "torn')  # a write cut off by a kill is ignored
    assert len(read_points(path)[1]) == len(SPECS)

    # A dozen CPU passes time mostly noise, and a fit of noise may predict negative times (the next test): give
    # the refit times that follow the features, to test the pipeline (fitting itself: tests/test_calibration.py).
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    for p in rows[1:]:
        p["wall_s"] = 1e-3 + 2e-6 * p["num_tokens"] + 1e-8 * p["decode_context"] + 1e-5 * p["num_seqs"]
        p["wall_repeats"] = [p["wall_s"]] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(profile_cmd, ["--from-points", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "KV capacity" in result.output and json.loads(out.read_text())["meta"]["card"] == "cpu"
    result = CliRunner().invoke(profile_cmd, ["--check", str(out)])
    assert result.exit_code == 0 and "held-out" in result.output, result.output


def test_only_measures_the_named_sweep_kinds(tmp_path):
    """``--only``: a sweep of one kind of pass, as when one kind is re-measured to add to a profile; a kind this
    engine's sweep does not make (eager-mixed without mixed graphs) is an error, not an empty points file."""
    _, points = run_sweep("tiny-llama", "fp32", tmp_path / "p.points.jsonl", device="cpu", progress=False,
                          only=("decode",), max_points=3)
    assert len(points) == 3 and {p["sweep"] for p in points} == {"decode"}
    with pytest.raises(ValueError, match="no pass of kind eager-mixed"):
        run_sweep("tiny-llama", "fp32", tmp_path / "q.points.jsonl", device="cpu", progress=False,
                  only=("eager-mixed",))
    with pytest.raises(ValueError, match="unknown sweep kind 'eager'"):
        run_sweep("tiny-llama", "fp32", tmp_path / "q.points.jsonl", device="cpu", only=("eager",))


def test_measure_records_the_graph_path_and_its_padded_tokens():
    from types import SimpleNamespace

    import numpy as np

    from calibration.sweep import measure, mixed_graph_buckets

    def padded_tokens(plan):
        return next((b for b in (16, 64) if b >= plan.num_tokens), None) if plan.num_tokens > plan.num_seqs else None

    class Timer:
        def time(self, plan):
            return [0.01] * 3, [None] * 3, [1] * sum(plan.samples)

    graphs = SimpleNamespace(mixed_buckets=(16, 64), padded_tokens=padded_tokens)
    runner = SimpleNamespace(graphs=graphs, uses_graph=lambda plan: plan.num_tokens <= 64)
    llm = SimpleNamespace(runner=runner, model_config=SimpleNamespace(vocab_size=100),
                          num_kv_blocks=64, block_size=16, max_model_len=512)
    assert mixed_graph_buckets(llm) == [16, 64]
    rng = np.random.default_rng(0)
    cases = [(SPECS[1], True, 64), (SPECS[4], False, None), (SPECS[-2], True, 16), (SPECS[-1], True, 64),
             (SPECS[6], True, None)]  # prefill of 17 and 100 tokens; mixed of 14 and 19 tokens; decode of 4
    for spec, graph, tokens in cases:
        point = measure(llm, spec, Timer(), rng)
        assert (point["graph"], point["graph_tokens"]) == (graph, tokens), spec
    llm.runner = SimpleNamespace()  # a runner of an engine without graphs
    assert mixed_graph_buckets(llm) == []
    point = measure(llm, SPECS[1], Timer(), rng)
    assert "graph" not in point and point["graph_tokens"] is None


def test_a_fit_that_predicts_negative_times_is_refused_and_writes_nothing(tmp_path):
    path = tmp_path / "p.points.jsonl"
    _sweep(path, SPECS)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for p in rows[1:]:  # time falling with tokens: the line through them is negative at the whole context
        p["wall_s"] = max(1e-4, 0.05 - 4e-4 * p["num_tokens"])
        p["wall_repeats"] = [p["wall_s"]] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(profile_cmd, ["--from-points", str(path), "--out", str(out)])
    assert result.exit_code != 0 and "cannot fit" in result.output and "positive time" in result.output
    assert not out.exists()


def test_resume_refuses_other_mixed_graph_buckets(tmp_path):
    path = tmp_path / "p.points.jsonl"
    path.write_text(json.dumps({"header": {"model": "tiny-llama", "dtype": "fp32", "card": "cpu",
                                           "mixed_graph_buckets": [16, 32]}}) + "\n")
    with pytest.raises(ValueError, match="mixed-graph buckets"):
        _sweep(path, SPECS[:1])


def test_resume_refuses_other_model(tmp_path):
    path = tmp_path / "p.points.jsonl"
    path.write_text(json.dumps({"header": {"model": "llama-2-7b", "dtype": "bf16"}}) + "\n")
    with pytest.raises(ValueError, match="llama-2-7b"):
        _sweep(path, SPECS[:1])


@pytest.mark.parametrize("args, message", [
    ([], "--out"),
    (["--out", "x.json"], "--model"),
    (["--model", "no-such-model", "--out", "x.json"], "unknown model"),
    (["--model", "tiny-llama", "--dtype", "int8", "--out", "x.json"], "int8"),
    (["--check", "no-such-profile"], "shipped"),
    (["--check", "llama-2-7b", "--model", "tiny-llama"], "--check takes only"),
    (["--plot", "d", "--model", "tiny-llama", "--out", "x.json"], "--plot goes with --check"),
    (["--model", "tiny-llama", "--out", "x.json", "--time-budget", "0"], "time-budget"),
    (["--model", "tiny-llama", "--out", "x.json", "--only", "eager"], "'eager' is not one of"),
])
def test_cli_bad_flags_give_clear_errors(args, message):
    result = CliRunner().invoke(profile_cmd, args)
    assert result.exit_code != 0
    assert message in result.output


def test_cli_check_prints_heldout_error_and_capacity():
    result = CliRunner().invoke(profile_cmd, ["--check", "llama-2-7b"])
    assert result.exit_code == 0, result.output
    assert "KV capacity" in result.output and "median" in result.output and "p95" in result.output


def test_an_aged_cache_scatters_a_pass_over_the_cache_and_changes_nothing_else():
    """``aged_kv``: the same pass, its blocks in several runs across the cache instead of one run at its start."""
    spec = plans.PassSpec("mixed", decode_contexts=(2700,) * 8, chunks=((1000, 700, 0),))
    fresh, fresh_plan, _ = plans.build_plan(spec, 14000, 16, np.random.default_rng(0), 32000, 4096)
    aged, aged_plan, _ = plans.build_plan(spec, 14000, 16, np.random.default_rng(0), 32000, 4096, aged_kv=True)
    assert plan_features(aged_plan) == plan_features(fresh_plan) == plan_features(spec)

    def runs(plan):
        return [1 + int(np.count_nonzero(np.diff(r.block_table) != 1)) for r in plan.requests]

    assert runs(fresh_plan) == [1] * 9 and max(b for r in fresh_plan.requests for b in r.block_table) < 2000
    assert min(runs(aged_plan)) > 1 and max(b for r in aged_plan.requests for b in r.block_table) > 10000
    assert aged.block_manager.num_free_blocks == fresh.block_manager.num_free_blocks  # the aging left nothing held
    plans.release(aged)
    assert aged.block_manager.num_free_blocks == 14000


def test_kv_layout_benchmark_runs_on_the_cpu(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "kv.json"
    subprocess.run([sys.executable, "-m", "benchmarks.kv_layout_gpu", "--model", "tiny-llama", "--device", "cpu",
                    "--num-kv-blocks", "2000", "--batches", "2,3", "--contexts", "60", "--rounds", "1",
                    "--out", str(out)], check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["mean_context"]) for r in rows] == [(2, 60), (3, 60)]
    assert all(r["fresh_s"] > 0 and r["aged_s"] > 0 for r in rows)


def test_an_aged_sweep_says_so_and_resumes_only_aged(tmp_path):
    path = tmp_path / "p.points.jsonl"
    header, points = run_sweep("tiny-llama", "fp32", path, device="cpu", progress=False, specs=SPECS[5:7],
                               kv_layout="aged")
    assert header["kv_layout"] == "aged" and len(points) == 2 and all(p["wall_s"] > 0 for p in points)
    with pytest.raises(ValueError, match="aged KV cache, not fresh"):
        _sweep(path, SPECS[5:8])
    with pytest.raises(ValueError, match="unknown KV layout 'old'"):
        run_sweep("tiny-llama", "fp32", tmp_path / "q.points.jsonl", device="cpu", specs=SPECS[:1], kv_layout="old")


def test_engine_passes_benchmark_runs_on_the_cpu(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "ep.json"
    subprocess.run([sys.executable, "-m", "benchmarks.engine_passes_gpu", "--model", "tiny-llama", "--device", "cpu",
                    "--profile", "llama-2-7b-analytic", "--concurrency", "3", "--requests", "6", "--prompt-len",
                    "normal:40:0.3", "--output-len", "fixed:6", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert {r["third"] for r in rows} == {0, 2} and sum(r["passes"] for r in rows) > 6
    assert all(r["median_span_s"] > 0 and r["span_over_predicted"] > 0 for r in rows)


def test_chunk_runs_benchmark_runs_on_the_cpu(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "cr.json"
    subprocess.run([sys.executable, "-m", "benchmarks.chunk_runs_gpu", "--model", "tiny-llama", "--device", "cpu",
                    "--profile", "llama-2-7b-analytic", "--prompts", "40,90", "--token-budget", "32", "--repeats", "2",
                    "--gaps", "0,0.01", "--out", str(out)], check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    # a 90-token prompt at a 32-token budget: two chunks that sample nothing, then the one that samples
    assert [(r["gap_s"], r["prompt_tokens"], r["passes"]) for r in rows] == [(0, 40, 2), (0, 90, 3), (0.01, 40, 2),
                                                                             (0.01, 90, 3)]
    assert all(len(r["served_runs_s"]) == 2 and r["served_s"] > 0 and r["synced_s"] > 0 for r in rows)
    assert all(r["predicted_s"]["llama-2-7b-analytic"] > 0 for r in rows)
    bad = subprocess.run([sys.executable, "-m", "benchmarks.chunk_runs_gpu", "--device", "cpu", "--gaps", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--gaps non-negative" in bad.stderr
