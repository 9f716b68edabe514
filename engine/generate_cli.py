"""``splitfuse generate``: run prompts through the LLM pipeline and print the outputs and their timings."""

from __future__ import annotations

import time

import click

from engine.config import EngineConfig
from engine.policy import PolicyConfig, SamplingParams, scheduler_class
from engine.policy.options import config_options
from engine.presets import BUNDLED_TINY_MODEL, PRESETS

DEFAULT_PROMPTS = ("The quick brown", "Dynamic SplitFuse", "A paged KV cache", "Once upon a time")


def _parse_prompt(prompt: str, has_tokenizer: bool) -> str | list[int]:
    """Text when the model has a tokenizer; otherwise the prompt must be token ids such as '1 5 42'."""
    if has_tokenizer:
        return prompt
    try:
        return [int(t) for t in prompt.replace(",", " ").split()]
    except ValueError:
        raise click.UsageError("this model has no tokenizer: pass each --prompt as token ids, e.g. '1 5 42'") \
            from None


@click.command()
@click.option("--model", default=str(BUNDLED_TINY_MODEL), show_default="the bundled tiny-llama checkpoint",
              help=f"Preset ({', '.join(PRESETS)}) or a local Hugging Face directory.")
@click.option("--prompt", "prompts", multiple=True, help="A prompt (repeat for several).")
@click.option("--max-tokens", default=32, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 means greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=float)
@click.option("--top-k", default=-1, show_default=True, type=int)
@config_options(PolicyConfig, exclude=("balancer",))
@config_options(EngineConfig)
def generate(model, prompts, max_tokens, temperature, top_p, top_k, **options):
    """Generate text with the engine and print a short timing table."""
    from engine.llm import LLM

    try:
        seed = options["seed"]
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed if temperature > 0 else None)
        config = EngineConfig.from_kwargs(model, **options)
        scheduler_class(config.policy.scheduler)  # fail fast on a bad name, before the model loads
        start = time.monotonic()
        llm = LLM(config)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    load_s = time.monotonic() - start
    inputs = [_parse_prompt(p, llm.tokenizer is not None) for p in (prompts or DEFAULT_PROMPTS)]
    start = time.monotonic()
    outputs = llm.generate(inputs, params)
    wall_s = time.monotonic() - start

    engine, policy = llm.engine, config.policy
    click.echo(f"model {model} on {engine.device} ({str(engine.dtype).removeprefix('torch.')}), scheduler "
               f"{policy.scheduler}, max_num_batched_tokens {policy.max_num_batched_tokens}, {engine.num_kv_blocks} "
               f"KV blocks of "
               f"{policy.block_size} tokens; loaded in {load_s:.2f} s\n")
    for i, out in enumerate(outputs):
        sample = out.outputs[0]
        shown = sample.text if sample.text is not None else sample.token_ids
        prompt = out.prompt if out.prompt is not None else out.prompt_token_ids
        click.echo(f"[{i}] {prompt!r} -> {shown!r}" if out.error is None else f"[{i}] error: {out.error}")
    click.echo(f"\n{'#':>3} {'prompt':>7} {'output':>7} {'TTFT ms':>9} {'e2e ms':>9} {'TPOT ms':>9}  finish")
    total_tokens = 0
    for i, out in enumerate(outputs):
        if out.error is not None:
            click.echo(f"{i:>3} {'-':>7} {'-':>7} {'-':>9} {'-':>9} {'-':>9}  error")
            continue
        m, n = out.metrics, len(out.outputs[0].token_ids)
        total_tokens += n
        tpot = f"{(m.e2e - m.ttft) / (n - 1) * 1e3:9.1f}" if n > 1 else f"{'-':>9}"
        click.echo(f"{i:>3} {len(out.prompt_token_ids):>7} {n:>7} {m.ttft * 1e3:9.1f} {m.e2e * 1e3:9.1f} {tpot}"
                   f"  {out.outputs[0].finish_reason}")
    click.echo(f"\n{total_tokens} tokens in {wall_s:.3f} s: {total_tokens / wall_s:.1f} tokens/s")
