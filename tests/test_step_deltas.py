"""``LLMEngine.step_deltas``, what the server's engine loop streams: the same requests, tokens, ends and reasons as
``step``'s ``RequestOutput``s, pass by pass, stop strings and stop tokens included."""

from __future__ import annotations

from engine import LLMEngine, SamplingParams

PROMPT = [3, 4, 5, 6, 7]


def make_engine() -> LLMEngine:
    return LLMEngine("tiny-llama", device="cpu", dtype="float32", token_budget=32, block_size=4, num_kv_blocks=200,
                     max_num_seqs=6)


def greedy_text(max_tokens: int) -> tuple[str, list[int]]:
    engine = make_engine()
    engine.add_request(PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    last = None
    while engine.has_unfinished():
        last = engine.step()[-1]
    return last.outputs[0].text, last.outputs[0].token_ids


def test_deltas_are_the_outputs_pass_by_pass():
    text, ids = greedy_text(12)
    stop = next(text[i:i + 2] for i in range(4, len(text) - 2) if text[i:i + 2].isprintable()
                and text[i:i + 2] not in text[:i + 1])
    params = [SamplingParams(max_tokens=12, temperature=0, stop=[stop]),  # ends on a stop string
              SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[ids[6]], ignore_eos=True),
              SamplingParams(max_tokens=9, temperature=1.0, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=3, temperature=0.8, seed=8)]
    by_outputs, by_deltas = make_engine(), make_engine()
    prompts = [PROMPT, PROMPT, PROMPT[:3], PROMPT[:2]]  # the first two end where the greedy text says
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        by_outputs.add_request(prompt, p, request_id=f"r{i}")
        by_deltas.add_request(prompt, p, request_id=f"r{i}")
    ends = {}
    while by_outputs.has_unfinished():
        outputs, deltas = by_outputs.step(), by_deltas.step_deltas()
        assert [(d[0], d[1], d[2], d[3]) for d in deltas] == \
            [(o.request_id, o.new_token_ids, o.finished, o.outputs[0].finish_reason) for o in outputs]
        assert all(d[4] is not None and d[4] >= 0 for d in deltas)  # seconds from arrival to first scheduled
        ends.update({d[0]: (d[3], len(outputs[i].outputs[0].token_ids)) for i, d in enumerate(deltas) if d[2]})
    assert not by_deltas.has_unfinished()
    assert ends["r0"][0] == "stop" and ends["r1"] == ("stop", 7) and ends["r2"] == ("length", 9)


def test_the_loop_benchmark_runs_both_loops_on_the_cpu(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "loop.json"
    subprocess.run([sys.executable, "-m", "benchmarks.serving_loop_gpu", "--requests", "6", "--max-tokens", "5",
                    "--repeats", "2", "--bins", "3,6", "--out", str(out)], check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["model"] == "tiny-llama" and {r["loop"] for r in result["table"]} == {"outputs", "deltas"}
    assert all(r["loop_us"] >= r["outputs_us"] > 0 and r["send_us"] > 0 for r in result["table"])
    assert [r["loop"] for r in result["runs"]] == ["outputs", "deltas", "deltas", "outputs"]  # alternating
    assert all(len(rates) == 2 and min(rates) > 0 for rates in result["rates"].values())
    bad = subprocess.run([sys.executable, "-m", "benchmarks.serving_loop_gpu", "--requests", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--requests must be at least 1" in bad.stderr
