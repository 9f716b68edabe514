"""Fit a profile's energy section from a ``pass_energy_gpu`` result, without a GPU.

    python -m benchmarks.pass_energy_fit benchmarks/results/pass_energy_h200.json \\
        calibration/profiles/llama-2-7b-h200-bf16.json [--write]

``pass_energy_gpu`` replayed a dozen passes back to back while NVML's energy counter ran (joules and ms per pass,
the card's idle power and power limit). Each case's plan is rebuilt here as that script built it
(``calibration.plans.build_plan``, torch-free; a SplitFuse case's parts are its decodes alone and its chunk alone),
its features taken, and ``calibration.energy.fit_energy`` fits the energy model on them. The section records its
provenance: the source file, the number of passes, that it is fitted from a benchmark and not from the profile's
own sweep, and the fit's in-sample and leave-one-out errors. Prints the fit; ``--write`` stores the section in the
profile (which must be of the same card).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT
from calibration.energy import fit_energy
from calibration.plans import PassSpec, build_plan, release
from calibration.profile import load_profile
from engine.policy import PassFeatures, SamplingParams, plan_features

# The cases of ``benchmarks.pass_energy_gpu`` (kept in step with its WHOLE and SPLIT; that script imports torch).
WHOLE = {"prefill 768": {"chunk": 768}, "704 + 64 decodes @ 1k": {"chunk": 704, "decodes": 64},
         "704 + 64 decodes @ 256": {"chunk": 704, "decodes": 64, "ctx": 256},
         "752 + 16 decodes @ 1k": {"chunk": 752, "decodes": 16}, "decode b1 @ 1k": {"decodes": 1},
         "prefill 2048 (eager)": {"chunk": 2048}}
SPLIT = ("704 + 64 decodes @ 1k", "704 + 64 decodes @ 256", "752 + 16 decodes @ 1k")
GREEDY = SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)


def case_features(profile, decodes: int = 0, ctx: int = 1024, chunk: int = 0) -> PassFeatures:
    """The features of ``Passes.plan(decodes, ctx, chunk)`` of ``benchmarks.engine_gpu``."""
    spec = PassSpec("bench", decode_contexts=(ctx - 1,) * decodes, chunks=((0, chunk, 0),) if chunk else ())
    scheduler, plan, _ = build_plan(spec, profile.num_kv_blocks, profile.block_size, np.random.default_rng(0),
                                    32000, profile.max_model_len, GREEDY)
    release(scheduler)
    return plan_features(plan)


def cases(profile) -> dict[str, PassFeatures]:
    out = {}
    for name, kw in WHOLE.items():
        out[name] = case_features(profile, **kw)
        if name in SPLIT:
            out[f"{name}: its decodes alone"] = case_features(profile, kw["decodes"], kw.get("ctx", 1024))
            out[f"{name}: its chunk alone"] = case_features(profile, chunk=kw["chunk"])
    return out


def fit_from_benchmark(result_path: Path, profile):
    """(energy model, leave-one-out relative errors by case) from a ``pass_energy_<card>.json``."""
    d = json.loads(Path(result_path).read_text())
    features = cases(profile)
    names = [n for n in d["median"] if n in features]  # the memory streams are no passes
    X = {k: np.array([getattr(features[n], k) for n in names]) for k in PassFeatures._fields}
    seconds = np.array([d["median"][n]["ms"] for n in names]) / 1e3
    joules = np.array([d["median"][n]["joules"] for n in names])
    loo = {}
    for i, name in enumerate(names):
        keep = np.arange(len(names)) != i
        model = fit_energy({k: v[keep] for k, v in X.items()}, seconds[keep], joules[keep], d["idle_w"])
        loo[name] = float(model.predict_array(seconds[i:i + 1], {k: v[i:i + 1] for k, v in X.items()})[0]
                          / joules[i] - 1.0)
    try:
        source_name = str(Path(result_path).resolve().relative_to(ROOT))
    except ValueError:
        source_name = str(result_path)
    source = {"source": source_name, "card": d.get("card"), "date": d.get("date"),
              "method": "fitted, not swept: the passes of benchmarks/pass_energy_gpu.py (each replayed back to back "
                        "under NVML's energy counter; medians of its rounds), not the profile's own sweep",
              "coverage": {k: [int(X[k].min()), int(X[k].max())] for k in ("num_tokens", "num_seqs", "decode_context")},
              "loo_median_abs_rel_err": float(np.median(np.abs(list(loo.values())))),
              "loo_max_abs_rel_err": float(np.max(np.abs(list(loo.values()))))}
    model = fit_energy(X, seconds, joules, d["idle_w"], d.get("power_limit_w"), source)
    return model, loo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="a pass_energy_<card>.json")
    ap.add_argument("profile", type=Path, help="the profile to fit the section for (same card)")
    ap.add_argument("--write", action="store_true", help="store the energy section in the profile")
    args = ap.parse_args()
    profile = load_profile(args.profile)
    model, loo = fit_from_benchmark(args.result, profile)
    card = model.fit.get("card")
    if card != profile.meta.get("card"):
        raise SystemExit(f"{args.result} was measured on {card!r}, {args.profile} on {profile.meta.get('card')!r}")
    print(f"{card}: idle {model.idle_w:.1f} W, limit {model.power_limit_w} W; per pass {model.coef['intercept']:.3f}"
          f" J, per token {model.coef['tokens'] * 1e3:.3f} mJ, per decode context token "
          f"{model.coef['decode_context'] * 1e6:.2f} uJ, per prompt token x context "
          f"{model.coef['prefill_attention'] * 1e9:.3f} nJ")
    print(f"{model.fit['passes']} passes: |relative error| median {model.fit['median_abs_rel_err']:.2%}, max "
          f"{model.fit['max_abs_rel_err']:.2%}; leave-one-out median {model.fit['loo_median_abs_rel_err']:.2%}, "
          f"max {model.fit['loo_max_abs_rel_err']:.2%}")
    for name, err in loo.items():
        print(f"  {name:<44} leave-one-out {err:+.2%}")
    if args.write:
        profile.with_energy(model).save(args.profile)
        print(f"wrote the energy section into {args.profile}")


if __name__ == "__main__":
    main()
