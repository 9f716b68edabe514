"""A prompt's token ids, checked: the one implementation for the engine and the server's API process (torch-free)."""

from __future__ import annotations


def check_prompt(prompt, tokenizer, vocab_size: int) -> list[int]:
    """Token ids of ``prompt`` (text, tokenized, or token ids); ValueError naming the problem for an empty,
    untokenizable or out-of-vocabulary one."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt is a string but the model has no tokenizer; pass token ids instead")
        if not prompt:
            raise ValueError("prompt is empty")
        return list(tokenizer(prompt)["input_ids"])
    if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
        raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("prompt is empty")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return list(prompt)


PROMPT_KEYS = ("prompt", "prompt_token_ids")


def split_prompt(prompt) -> tuple[str | None, object]:
    """(the prompt's text or None, what ``check_prompt`` takes) for a prompt as vLLM accepts it: text, token ids,
    ``{"prompt": text}`` or ``{"prompt_token_ids": ids}`` (ids win when both are given). ValueError names an
    unknown key."""
    if isinstance(prompt, dict):
        unknown = sorted(set(prompt) - set(PROMPT_KEYS))
        if unknown or not prompt:
            raise ValueError(f"a prompt dict takes the keys {' or '.join(PROMPT_KEYS)}, got {sorted(prompt)}")
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), prompt["prompt_token_ids"]
        prompt = prompt["prompt"]
    return (prompt if isinstance(prompt, str) else None), prompt
