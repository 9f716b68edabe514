"""The runner's packed inputs and the pass-graph paths, on the CPU: ``PassGraphs(capture=False)`` runs the very
buffers, bucketing and padding that the CUDA graphs replay, eagerly, and must sample what the plain eager path
samples."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import MIXED_BUCKETS, PassGraphs, bucket_sizes


def test_bucket_sizes_end_at_the_largest_size():
    assert bucket_sizes(6) == [1, 2, 4, 6] and bucket_sizes(256)[-1] == 256
    assert bucket_sizes(40, MIXED_BUCKETS) == [16, 32, 40]


@pytest.mark.parametrize("max_tokens", [0, 24, 64])
def test_graph_paths_sample_like_eager_path(max_tokens):
    """Decode graphs padded with one-token sequences, mixed graphs padded with orphan tokens and empty sequences
    (``max_tokens`` 24: passes of 17-24 tokens pad to 24, larger ones stay eager; 64: every pass is a graph).
    Requests arrive between steps, so passes of every size occur, not only full budgets."""
    g = torch.Generator().manual_seed(0)
    arrivals = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (5, 40, 17, 1, 23, 70, 9, 3)]

    def run(graphs: bool):
        llm = LLM("tiny-llama", device="cpu", dtype="float32", token_budget=32, block_size=4, num_kv_blocks=200,
                  max_num_seqs=6)
        engine, keys, tokens = llm.engine, [], {}
        if graphs:
            engine.runner.rebuild_graphs(6, max_tokens)
            run_graph = engine.runner.graphs.run_with_greedy
            engine.runner.graphs.run_with_greedy = lambda plan, *a: keys.append(
                (plan.num_tokens, engine.runner.graphs.key(plan))) or run_graph(plan, *a)
        step = 0
        while arrivals[step:] or engine.has_unfinished():
            if step < len(arrivals):
                engine.add_request(arrivals[step], SamplingParams(max_tokens=8 + step, temperature=0,
                                                                  ignore_eos=True), request_id=str(step))
            for out in engine.step():
                tokens[out.request_id] = out.outputs[0].token_ids
            step += 1
        return tokens, keys

    eager, _ = run(graphs=False)
    replayed, keys = run(graphs=True)
    assert replayed == eager and len(eager) == len(arrivals)
    pads = {kind for t, (kind, b) in keys if b > t}
    assert "decode" in pads  # a decode batch padded up to its bucket
    assert ("mixed" in pads) == (max_tokens > 0)  # a pass with prompt tokens padded up to its bucket


def test_padding_past_a_bucket_is_refused():
    llm = LLM("tiny-llama", device="cpu", dtype="float32", token_budget=32, block_size=4, num_kv_blocks=50)
    graphs = PassGraphs(llm.engine.runner, 4, 16, capture=False)
    llm.engine.add_request(list(range(3, 23)), SamplingParams(max_tokens=1))
    plan = llm.engine.scheduler.schedule()
    assert plan.num_tokens == 20 and graphs.key(plan) is None and graphs.padded_tokens(plan) is None
    from engine.inputs import pack_inputs
    with pytest.raises(ValueError, match="cannot pad a pass of 20 tokens"):
        pack_inputs(plan, 4, pad_to=graphs.layouts[("mixed", 16)])


@pytest.mark.parametrize("tokens,seqs,width,samples",
                         [(7, 3, 5, 2), (2048, 163, 129, 1), (1, 1, 1, 0), (16, 15, 256, 15)])
def test_packed_inputs_start_on_16_byte_boundaries(tokens, seqs, width, samples):
    """Every input view starts 16-byte aligned whatever the pass's shape (Triton specializes on pointer alignment:
    shifting offsets compiled new kernel variants mid-run), and the views tile the buffer without overlap."""
    from engine.inputs import Layout
    layout = Layout(tokens, seqs, width, samples)
    buf = torch.zeros(layout.size, dtype=torch.int32)
    views = layout.views(buf)
    assert [v.numel() for v in views] == [tokens, tokens, tokens, seqs, seqs + 1, seqs * width, samples]
    assert all((v.data_ptr() - buf.data_ptr()) % 16 == 0 for v in views)
    for i, v in enumerate(views):
        v.fill_(i + 1)
    assert [int(v.min()) for v in views if v.numel()] == [i + 1 for i, v in enumerate(views) if v.numel()]
