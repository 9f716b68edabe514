"""The runner's packed inputs and the decode-graph path, on the CPU: ``DecodeGraphs(capture=False)`` runs the
very buffers, bucketing and padding that the CUDA graphs replay, eagerly, and must sample what the plain eager
path samples."""

from __future__ import annotations

import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import DecodeGraphs, bucket_sizes


def test_bucket_sizes_end_at_the_largest_batch():
    assert bucket_sizes(6) == [1, 2, 4, 6] and bucket_sizes(256)[-1] == 256


def test_decode_graph_path_samples_like_eager_path():
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (5, 40, 17, 1, 23)]

    def run(graphs: bool):
        llm = LLM("tiny-llama", device="cpu", dtype="float32", token_budget=16, block_size=4, num_kv_blocks=200)
        runner, batches = llm.engine.runner, []
        if graphs:
            runner.graphs = DecodeGraphs(runner, 6, capture=False)
            run_graph = runner.graphs.run
            runner.graphs.run = lambda plan: batches.append(plan.num_seqs) or run_graph(plan)
        return [o.token_ids for o in llm.generate(prompts, params)], batches

    eager, _ = run(graphs=False)
    replayed, batches = run(graphs=True)
    assert replayed == eager
    assert 3 in batches or 5 in batches  # a batch that was padded up to its bucket (4 or 6)
