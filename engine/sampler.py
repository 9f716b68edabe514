"""Token sampling: greedy at temperature 0, else temperature, top-k and top-p, one row per sampling request.

A request with a seed draws from a generator seeded by (seed, output index), so its tokens do not depend on
what else shares the batch or on preemption; requests without a seed share the engine's seeded generator.
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
        params = [r.sampling_params for r in requests]
        greedy_tokens = logits.argmax(dim=-1)
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if not random_rows:
            return greedy_tokens.tolist()
        rows = to_device(random_rows, torch.int64, logits.device)
        picked = self._sample(logits[rows], [requests[i] for i in random_rows])
        greedy_tokens[rows] = picked
        return greedy_tokens.tolist()

    def takes_greedy(self, requests: list[Request]) -> bool:
        """Whether the tokens of ``requests`` are each row's plain argmax (``Request.takes_argmax``)."""
        return all(r.takes_argmax for r in requests)

    def _hold_back_stop_tokens(self, logits: torch.Tensor, requests: list[Request]) -> None:
        for i, r in enumerate(requests):
            banned = r.banned_token_ids()
            if banned:
                logits[i, banned] = float("-inf")

    def _uniforms(self, requests: list[Request]) -> torch.Tensor:
        u = []
        for r in requests:
            seed = r.sampling_params.seed
            if seed is None:
                u.append(torch.rand(1, generator=self.generator))
            else:
                g = torch.Generator(device="cpu").manual_seed(request_seed(seed, r.num_output_tokens))
                u.append(torch.rand(1, generator=g))
        return torch.cat(u)

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Inverse-CDF sampling over the top-k / top-p support of the temperature-scaled distribution."""
        params = [r.sampling_params for r in requests]
        vocab = logits.shape[-1]
        device = logits.device
        temperature = to_device([p.temperature for p in params], torch.float32, device)
        top_k = to_device([p.top_k if 0 < p.top_k < vocab else vocab for p in params], torch.int64, device)
        top_p = to_device([p.top_p for p in params], torch.float32, device)

        sorted_logits, sorted_ids = (logits / temperature[:, None]).sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=device)
        sorted_logits.masked_fill_(rank[None, :] >= top_k[:, None], float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # top-p: keep the smallest prefix whose mass reaches top_p (a token stays if the mass before it is short)
        mass_before = probs.cumsum(dim=-1) - probs
        probs.masked_fill_(mass_before >= top_p[:, None], 0.0)
        cdf = probs.cumsum(dim=-1)
        u = to_device(self._uniforms(requests), torch.float32, device)
        index = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1)
        num_kept = (probs > 0).sum(dim=-1)
        index = torch.minimum(index, num_kept - 1)
        return sorted_ids.gather(1, index[:, None]).squeeze(1)
