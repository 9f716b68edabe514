"""``PolicyConfig``: the one place where the scheduling policy's defaults are written.

The engine (``LLMEngine``, ``LLM``, ``splitfuse serve``/``generate``), the simulator (``ClusterConfig``, the
replica, ``splitfuse simulate``) and calibration (``splitfuse profile``) all take or build one; command-line
options and their defaults are generated from its fields (``engine.policy.options``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def option_metadata(text: str, *flags: str) -> dict:
    """A config field's metadata for its command-line option (``engine.policy.options``): the help text, and the
    flag declarations when they are not ``--field-name``."""
    return {"help": text, **({"flags": flags} if flags else {})}


# Old names of fields that still work as keyword arguments and command-line flags.
ALIASES = {"token_budget": "max_num_batched_tokens"}


def resolve_aliases(kwargs: dict) -> dict:
    """``kwargs`` with old field names (``ALIASES``) replaced by the current ones; ValueError when both are given
    with different values."""
    out = dict(kwargs)
    for old, new in ALIASES.items():
        if old in out:
            value = out.pop(old)
            if new in out and out[new] != value:
                raise ValueError(f"{old} is another name for {new}; got {old}={value!r} and {new}={out[new]!r}")
            out[new] = value
    return out


def option_names(name: str) -> str:
    """A field's flag and its old names, for error messages: "--max-num-batched-tokens, alias --token-budget"."""
    old = [f"--{o.replace('_', '-')}" for o, new in ALIASES.items() if new == name]
    return f"--{name.replace('_', '-')}" + "".join(f", alias {o}" for o in old)


@dataclass(frozen=True)
class _PolicyFields:
    """What the scheduler, the block manager and the load balancer decide by."""

    scheduler: str = field(default="splitfuse", metadata=option_metadata("splitfuse | prefill-first | decode-first."))
    max_num_batched_tokens: int = field(default=768, metadata=option_metadata(
        "The token budget: most tokens one forward pass carries (prompt chunks + decodes).",
        "--max-num-batched-tokens", "--token-budget"))
    max_num_seqs: int = field(default=256, metadata=option_metadata("Most requests in one batch."))
    block_size: int = field(default=16, metadata=option_metadata("Tokens per KV block."))
    enable_prefix_caching: bool = field(
        default=True, metadata=option_metadata("Share computed prompt blocks between requests.",
                                     "--enable-prefix-caching/--no-enable-prefix-caching",
                                     "--prefix-caching/--no-prefix-caching"))
    balancer: str = field(default="least-requests", metadata=option_metadata(
        "Which replica gets the next request: round-robin, random, least-requests, least-tokens, least-kv or "
        "power-of-two."))
    kv_report_interval: float = field(default=1.0, metadata=option_metadata(
        "Seconds between a replica's reports of its KV cache usage to the balancer (the router's health checks): "
        "least-kv picks by the last report, plus the prompts not started then, plus the tokens sent since."))

    def __post_init__(self) -> None:
        # The scheduler and balancer names are checked where they are looked up (``make_scheduler``,
        # ``make_balancer``), which this module does not import.
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} ({option_names(name)}) must be an integer >= 1, got {value!r}")
        if not self.kv_report_interval > 0:
            raise ValueError(f"kv_report_interval (--kv-report-interval) must be > 0 seconds, got "
                             f"{self.kv_report_interval!r}")


class PolicyConfig(_PolicyFields):
    """What the scheduler, the block manager and the load balancer decide by (the fields of ``_PolicyFields``).
    ``token_budget`` is the old name of ``max_num_batched_tokens`` (vLLM's) and still works as a keyword and an
    attribute."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **resolve_aliases(kwargs))

    @property
    def token_budget(self) -> int:
        return self.max_num_batched_tokens
