"""A NON-MEASURED profile from a roofline with stated assumptions, so the simulator can run before a GPU sweep.

Each pass of the same sweep a GPU profile measures gets a time from:
    GEMMs    max(weight bytes / BW, 2 * linear params * T / RATE)
    LM head  max(head bytes / BW, 2 * vocab * hidden * sampled rows / RATE)
    decode attention   KV bytes read / (ATTN_BW_EFF * BW)
    prefill attention  causal QK^T and PV FLOPs / (ATTN_RATE_EFF * RATE)
    host     HOST_S per pass + HOST_PER_SEQ_S per sequence (input building, sampling, the sync)
times seeded log-normal noise; the points are then fitted exactly as measured ones are. Every number below
is an assumption, recorded in the profile's meta; none comes from a measurement of our engine.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np

from calibration import plans
from calibration.fitting import build_profile
from calibration.profile import PROFILES_DIR, Profile
from engine.models.config import ModelConfig
from engine.policy import plan_features
from engine.presets import PRESETS

ASSUMPTIONS = {
    "card": "H100 80GB (assumed, not measured)",
    "card_memory_bytes": 81559 * 2**20,
    "gpu_memory_utilization": 0.9,
    "runtime_reserve_bytes": 2 * 2**30,  # CUDA context, activations, allocator slack
    "copy_bandwidth_Bps": 3.0e12,
    "matmul_flops": 6.0e14,  # what the engine's GEMMs achieve, not the card's peak
    "attn_bandwidth_efficiency": 0.8,
    "attn_flops_efficiency": 0.5,
    "host_s_per_pass": 1.0e-3,
    "host_s_per_seq": 5.0e-6,
    "noise_sigma": 0.02,
    "dtype_bytes": 2,
    "block_size": 16,
    "graph_max_batch": 512,
}


def shapes(config: ModelConfig) -> dict[str, int]:
    h, L = config.hidden_size, config.num_layers
    kv = config.num_kv_heads * config.head_dim
    per_layer = h * (config.num_heads * config.head_dim) + 2 * h * kv + config.num_heads * config.head_dim * h
    per_layer += 3 * h * config.intermediate_size
    return {"linear_params": L * per_layer, "head_params": config.vocab_size * h,
            "embed_params": config.vocab_size * h, "kv_per_token": 2 * L * kv}


def pass_seconds(f: dict, config: ModelConfig, a: dict = ASSUMPTIONS) -> float:
    s, item = shapes(config), a["dtype_bytes"]
    bw, rate = a["copy_bandwidth_Bps"], a["matmul_flops"]
    T, rows = f["num_tokens"], f["num_seqs"]
    gemm = max(s["linear_params"] * item / bw, 2 * s["linear_params"] * T / rate)
    head = max(s["head_params"] * item / bw, 2 * s["head_params"] * rows / rate)
    decode_attn = f["decode_context"] * s["kv_per_token"] * item / (a["attn_bandwidth_efficiency"] * bw)
    flops = 2 * 2 * config.num_layers * config.num_heads * config.head_dim * f["prefill_attention"] / 2
    prefill_attn = flops / (a["attn_flops_efficiency"] * rate)
    return gemm + head + decode_attn + prefill_attn + a["host_s_per_pass"] + a["host_s_per_seq"] * rows


def num_kv_blocks(config: ModelConfig, a: dict = ASSUMPTIONS) -> int:
    s = shapes(config)
    weights = (s["linear_params"] + s["head_params"] + s["embed_params"]) * a["dtype_bytes"]
    budget = a["card_memory_bytes"] * a["gpu_memory_utilization"] - weights - a["runtime_reserve_bytes"]
    return int(budget // (s["kv_per_token"] * a["dtype_bytes"] * a["block_size"]))


def analytic_profile(preset: str, seed: int = 0, repeats: int = 5) -> Profile:
    config = ModelConfig.from_dict(PRESETS[preset])
    a = ASSUMPTIONS
    blocks, bs = num_kv_blocks(config), a["block_size"]
    rng = np.random.default_rng(seed)
    points = []
    for spec in plans.sweep_specs(config.max_model_len, blocks, bs, seed=seed, table_per_size=0):
        f = plan_features(spec)._asdict()
        t = pass_seconds(f, config)
        reps = sorted(t * float(x) for x in np.exp(rng.normal(0.0, a["noise_sigma"], size=repeats)))
        points.append({"sweep": spec.sweep, "key": spec.key, **f, "wall_s": reps[repeats // 2],
                       "wall_repeats": [round(r, 7) for r in reps]})
    meta = {"model": preset, "card": a["card"], "dtype": "bf16", "tensor_parallel": 1, "kind": "analytic",
            "graph_max_batch": a["graph_max_batch"],
            "assumptions": dict(a), "date": datetime.date.today().isoformat(),
            "copy_bandwidth_Bps": a["copy_bandwidth_Bps"], "matmul_flops": a["matmul_flops"],
            "note": "NOT MEASURED: a roofline with the stated assumptions; use a measured profile for planning"}
    return build_profile(points, meta, bs, blocks, config.max_model_len, seed=seed)


def main(presets=("llama-2-7b", "llama-3-8b", "mistral-7b", "llama-2-13b"), out_dir: Path = PROFILES_DIR) -> None:
    for preset in presets:
        profile = analytic_profile(preset)
        path = profile.save(Path(out_dir) / f"{preset}-analytic.json")
        print(f"{path}: {profile.num_kv_blocks} KV blocks, held-out {profile.fit['heldout']}")


if __name__ == "__main__":
    main()
