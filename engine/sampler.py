"""Token sampling: greedy at temperature 0, else temperature, top-k and top-p, one row per sampling request.

A request with a seed draws from a generator seeded by (seed, output index), so its tokens do not depend on
what else shares the batch or on preemption; requests without a seed share the engine's seeded generator. How a
row that does not truncate draws is named in ``engine.config.SAMPLER_DRAW``, which served runs record.
"""

from __future__ import annotations

import torch

from engine.policy import Request

_MASK = 0xFFFF_FFFF_FFFF_FFFF


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list or tensor on ``device`` without a host sync (pinned, asynchronous on CUDA): the
    pass's one sync stays the final ``tolist``."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def request_seed(seed: int, output_index: int) -> int:
    """A 64-bit seed for the ``output_index``-th token of a request seeded with ``seed`` (an LCG-style mix)."""
    return (seed * 6364136223846793005 + output_index * 1442695040888963407 + 1) & _MASK


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request], greedy: torch.Tensor | None = None) -> list[int]:
        """One token id per row of ``logits`` [N, vocab] (row i belongs to ``requests[i]``). ``greedy``: each row's
        argmax if already taken (in a CUDA graph): used when every request is greedy and none holds back tokens."""
        if greedy is not None and self.takes_greedy(requests):
            return greedy.tolist()
        logits = logits.float()
        self._hold_back_stop_tokens(logits, requests)
        random_rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if len(random_rows) == len(requests):
            return self._sample(logits, requests).tolist()
        tokens = logits.argmax(dim=-1)
        if random_rows:
            rows = to_device(random_rows, torch.int64, logits.device)
            tokens[rows] = self._sample(logits[rows], [requests[i] for i in random_rows])
        return tokens.tolist()

    def takes_greedy(self, requests: list[Request]) -> bool:
        """Whether the tokens of ``requests`` are each row's plain argmax (``Request.takes_argmax``)."""
        return all(r.takes_argmax for r in requests)

    def _hold_back_stop_tokens(self, logits: torch.Tensor, requests: list[Request]) -> None:
        for i, r in enumerate(requests):
            banned = r.banned_token_ids()
            if banned:
                logits[i, banned] = float("-inf")

    def _uniforms(self, requests: list[Request]) -> torch.Tensor:
        """One uniform draw per request: unseeded ones from the engine's generator in one call, a seeded one from
        its own (seed, output index) generator."""
        seeds = [r.sampling_params.seed for r in requests]
        unseeded = [i for i, s in enumerate(seeds) if s is None]
        if len(unseeded) == len(requests):
            return torch.rand(len(requests), generator=self.generator)
        u = torch.empty(len(requests))
        if unseeded:
            u[unseeded] = torch.rand(len(unseeded), generator=self.generator)
        for i, (r, seed) in enumerate(zip(requests, seeds)):
            if seed is not None:
                g = torch.Generator(device="cpu").manual_seed(request_seed(seed, r.num_output_tokens))
                u[i] = torch.rand(1, generator=g)
        return u

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Inverse-CDF sampling of the temperature-scaled distribution, one draw per row: rows whose requests
        truncate it (top-k or top-p) sort their row to find the support; the others draw in vocabulary order,
        with no sort (a sort of every row over a 128k vocabulary is most of the sampler's device time)."""
        params = [r.sampling_params for r in requests]
        vocab = logits.shape[-1]
        truncating = [i for i, p in enumerate(params) if p.top_p < 1 or 0 < p.top_k < vocab]
        host = torch.tensor([[p.temperature for p in params],
                             [p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                             [p.top_p for p in params]], dtype=torch.float32)
        temperature, top_k, top_p, u = to_device(torch.cat([host, self._uniforms(requests)[None]]), torch.float32,
                                                 logits.device)
        scaled = logits / temperature[:, None]
        if not truncating:
            return _draw_in_vocab_order(scaled, u)
        if len(truncating) == len(requests):
            return _draw_truncated(scaled, u, top_k, top_p)
        kept = set(truncating)
        whole = [i for i in range(len(requests)) if i not in kept]
        rows_t, rows_w = (to_device(rows, torch.int64, logits.device) for rows in (truncating, whole))
        tokens = torch.empty(len(requests), dtype=torch.int64, device=logits.device)
        tokens[rows_t] = _draw_truncated(scaled[rows_t], u[rows_t], top_k[rows_t], top_p[rows_t])
        tokens[rows_w] = _draw_in_vocab_order(scaled[rows_w], u[rows_w])
        return tokens


def _draw_in_vocab_order(scaled: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row i's token where ``u[i]`` of its probability mass, summed in vocabulary order, is reached."""
    probs = scaled.softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    index = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    index.clamp_(max=scaled.shape[-1] - 1)
    # the sum's rounding can leave a draw on a token of no probability (one held back): take the row's top one
    return torch.where(probs.gather(1, index[:, None]).squeeze(1) > 0, index, probs.argmax(dim=-1))


def _draw_truncated(scaled: torch.Tensor, u: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Row i's token where ``u[i]`` of its mass is reached over its top-k / top-p support, summed from the top."""
    vocab = scaled.shape[-1]
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)
    sorted_logits.masked_fill_(rank[None, :] >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # top-p: keep the smallest prefix whose mass reaches top_p (a token stays if the mass before it is short)
    mass_before = probs.cumsum(dim=-1) - probs
    probs.masked_fill_(mass_before >= top_p[:, None], 0.0)
    cdf = probs.cumsum(dim=-1)
    index = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1)
    num_kept = (probs > 0).sum(dim=-1)
    index = torch.minimum(index, num_kept - 1)
    return sorted_ids.gather(1, index[:, None]).squeeze(1)
