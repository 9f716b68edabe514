"""What a sampled pass saves since its profile was swept, because the engine's sampler changed: the serving
section's ``sampler_saved`` (from profile version 20), measured on the card.

A profile's points were timed with the engine of their sweep, sampling as it sampled then. Up to commit 3b9a74b the
sampler sorted every sampled row over the whole vocabulary; since, a row with neither top-k nor top-p (the default)
draws in vocabulary order, without a sort. The sampler runs after the forward pass on the logits of the sampled
rows, whatever the pass, so the change is a time per pass and per sampled entry. Measured here as the engine's own
decode steps, the same requests on the same card with the engine of the sweep and with the engine now:

    python -m calibration.sampler_saved measure --model llama-3-8b --out now.json      # in each engine's tree
    python -m calibration.sampler_saved apply llama-3-8b-h200-bf16 --swept then.json --engine now.json --out F

``apply`` takes the saving at each measured batch (``fit_saved``; ``--swept`` and ``--engine`` may each be given
several times, alternate runs or models of the profile's vocabulary, and are averaged) and writes it into the
profile's serving section, which prices a sampled pass that much less (``Profile.predict``), and a greedy one as
before: it never ran the sampler.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

BATCHES = (1, 16, 64, 128, 256)


def decode_spans(llm, batch: int, prompt_len: int, steps: int, rng: np.random.Generator,
                 chunk_budget: int = 0) -> list[float]:
    """The spans from schedule to update (a profile's pass, ``PassRecord``) of the decode steps that held all
    ``batch`` requests of ``prompt_len`` random tokens, sampling at temperature 1 (what the sweep and the benchmark
    client ask for): at least ``steps`` of them, each request's outputs outlasting the prompts' passes (a pass
    takes 256 prompt tokens or more beside 256 decodes or fewer). ``chunk_budget``: the passes' token budget, which
    prompts sent behind the batch (one output each) then fill beside its decodes: the spans are of those passes
    (a prompt chunk beside the batch's decodes, sampling only them) instead."""
    from engine.policy import SamplingParams

    vocab = llm.model_config.vocab_size
    filler = steps * (chunk_budget - batch) if chunk_budget else 0
    outputs = steps - (-batch * prompt_len // 256) - (-filler // max(1, chunk_budget - batch))
    params = SamplingParams(max_tokens=outputs, temperature=1.0, ignore_eos=True)
    for _ in range(batch):
        llm.add_request(rng.integers(3, vocab, prompt_len).tolist(), params)
    longest = llm.max_model_len - 1
    while filler > 0:
        n = min(longest, filler)
        llm.add_request(rng.integers(3, vocab, n).tolist(), SamplingParams(max_tokens=1, ignore_eos=True))
        filler -= n
    records = []
    stop = llm.trace_passes(records.append)
    while llm.has_unfinished():
        llm.step()
    stop()
    f = [r.features for r in records]
    return [r.updated - r.start for r, x in zip(records, f) if x.decode_tokens == x.num_samples == batch
            and bool(x.prefill_tokens) == bool(chunk_budget)]


def measure(model: str, batches=BATCHES, prompt_len: int = 256, steps: int = 48, seed: int = 0,
            device: str = "cuda", chunked: bool = False) -> dict:
    """Median decode-step seconds per batch of ``model`` (random weights) on this engine; ``chunked``: of passes
    that also carry a prompt chunk up to the token budget (``decode_spans``)."""
    from engine.config import EngineConfig
    from engine.llm import LLMEngine
    from engine.policy import PolicyConfig

    dtype = "bfloat16" if device == "cuda" else "float32"
    policy = PolicyConfig()
    llm = LLMEngine(EngineConfig(model, policy, dtype=dtype, device=device, seed=seed))
    rng = np.random.default_rng(seed)
    budget = policy.token_budget if chunked else 0
    decode_spans(llm, 4, prompt_len, 8, rng, budget)  # warm up
    spans = {b: decode_spans(llm, b, prompt_len, steps, rng, budget) for b in batches}
    vocab = llm.model_config.vocab_size
    llm.close()
    return {"model": model, "vocab_size": vocab, "prompt_len": prompt_len, "steps": steps, "chunked": chunked,
            "batches": list(batches), "median_s": [float(np.median(spans[b])) for b in batches],
            "count": [len(spans[b]) for b in batches]}


def fit_saved(swept: list[dict], engine: list[dict]) -> tuple[list[int], list[float]]:
    """(Batches, seconds saved at each): the mean over the ``swept`` measurements (``measure`` on the engine of the
    sweep) less the mean over the ``engine`` ones, at least 0. The saving is kept per measured batch, not as a line:
    a sort's time jumps with the rows (for llama-3-8b on an H200 it doubled from 64 rows to 128). Measurements of
    models of one vocabulary pool: the sampler sees only the logits. ValueError unless all have one vocabulary and
    the same batches."""
    runs = [*swept, *engine]

    def key(run: dict) -> tuple:
        return run["vocab_size"], run["batches"], run.get("chunked", False)

    if not swept or not engine or any(key(r) != key(runs[0]) for r in runs):
        raise ValueError("the measurements must be of one vocabulary, the same batches and the same passes (with "
                         "prompt chunks or without), on both engines")
    saved = (np.mean([r["median_s"] for r in swept], axis=0) - np.mean([r["median_s"] for r in engine], axis=0))
    timed = np.isfinite(saved)  # a batch no pass held (with a chunk, max_num_seqs can leave no room for it)
    if not timed.any():
        raise ValueError("no batch was timed on both engines")
    return [b for b, t in zip(runs[0]["batches"], timed) if t], np.maximum(saved[timed], 0.0).tolist()


@click.group()
def main() -> None:
    """Measure and apply what a sampled pass saves since a profile's sweep."""


def _batches(ctx, param, text: str) -> list[int]:
    """``--batches`` "1,16,64" as positive increasing integers, or a usage error naming the value."""
    try:
        batches = [int(b) for b in text.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or any(b <= a for a, b in zip(batches, batches[1:])):
        raise click.BadParameter(f"{text!r} is not a comma-separated list of increasing batch sizes >= 1")
    return batches


@main.command("measure")
@click.option("--model", required=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--batches", default=",".join(map(str, BATCHES)), show_default=True, callback=_batches)
@click.option("--prompt-len", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--steps", type=click.IntRange(min=2), default=48, show_default=True)
@click.option("--device", default="cuda", show_default=True)
@click.option("--chunked", is_flag=True, help="Passes with a prompt chunk beside the decodes, up to the budget.")
def measure_command(model: str, out: Path, batches: list[int], prompt_len: int, steps: int, device: str,
                    chunked: bool) -> None:
    """Time this engine's decode steps per batch; write them as JSON with the card and commit."""
    import datetime

    import torch

    from calibration.sweep import git_commit, versions

    torch.set_grad_enabled(False)
    result = measure(model, batches, prompt_len, steps, device=device, chunked=chunked)
    result["meta"] = {"card": torch.cuda.get_device_name() if device == "cuda" else device, "commit": git_commit(),
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "versions": versions()}
    for b, s, c in zip(result["batches"], result["median_s"], result["count"]):
        click.echo(f"{model} batch {b:>4}: {1e3 * s:8.3f} ms median of {c} decode steps")
    out.write_text(json.dumps(result, indent=1))


@main.command("apply")
@click.argument("profile")
@click.option("--swept", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, multiple=True,
              help="`measure` on the engine the profile was swept with (repeatable).")
@click.option("--engine", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, multiple=True,
              help="`measure` on the engine now, same card (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def apply_command(profile: str, swept: tuple[Path, ...], engine: tuple[Path, ...], out: Path) -> None:
    """Write PROFILE with the saving measured by the two engines in its serving section: of decode steps, and of
    passes with a prompt chunk where measurements with --chunked are among them."""
    from calibration.profile import load_profile
    from engine.presets import PRESETS

    p = load_profile(profile)
    then, now = ([json.loads(f.read_text()) for f in files] for files in (swept, engine))
    if p.serving is None:
        raise click.UsageError(f"{profile} has no serving section to hold the saving")
    vocab = PRESETS.get(p.meta.get("model"), {}).get("vocab_size")
    if then[0]["vocab_size"] != vocab:
        raise click.UsageError(f"the measurements are of a vocabulary of {then[0]['vocab_size']} tokens, the "
                               f"profile's model {p.meta.get('model')} has {vocab}")
    saved, fit = {}, {"models": sorted({r["model"] for r in then + now}), "card": now[0]["meta"]["card"],
                      "swept_commit": then[0]["meta"]["commit"], "engine_commit": now[0]["meta"]["commit"],
                      "date": now[0]["meta"]["date"], "prompt_len": now[0]["prompt_len"]}
    for kind, chunked in (("decode", False), ("mixed", True)):
        kind_then = [r for r in then if r.get("chunked", False) == chunked]
        kind_now = [r for r in now if r.get("chunked", False) == chunked]
        if not kind_then and not kind_now and chunked:
            continue
        try:
            batches, seconds = fit_saved(kind_then, kind_now)
        except ValueError as e:
            raise click.UsageError(f"{kind} passes: {e}") from None
        saved[kind] = {"batches": batches, "seconds": seconds}
        fit[kind] = {f"{name}_s": [[x if np.isfinite(x) else None for x in r["median_s"]] for r in runs]
                     for name, runs in (("swept", kind_then), ("engine", kind_now))}
        click.echo(f"{p.meta.get('model')}: a sampled {kind} pass saves " + ", ".join(
            f"{1e3 * x:.3f} ms at {b}" for b, x in zip(batches, seconds)) + " sampled entries")
    # its hosts were measured against the engine of the sweep, which this saving bridges: they stay
    p.with_serving(p.serving.with_sampler_saved(saved, fit)).with_hosts(p.hosts).save(out)
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
