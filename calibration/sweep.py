"""The GPU sweep: time real engine steps over the passes of ``plans.sweep_specs`` (imports torch).

One engine step is what ``LLMEngine.step`` does: the scheduler builds the plan, the runner prepares inputs,
runs the forward pass and samples (which syncs), and the scheduler applies the result. Per pass we take the
scheduling and update time once (they are host-only and deterministic) and time ``runner.run(plan)`` several
times, on the host clock with a device sync and with CUDA events. Where NVML answers (nvidia-ml-py,
``calibration.power``), each pass is then replayed back to back for ``energy_s`` under the card's energy counter:
its joules and seconds per pass (the header holds the card's idle power and power limit). Points are appended to a
JSONL file as they come, so an interrupted sweep resumes where it stopped and a time-boxed one keeps what it
measured.
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from calibration import plans
from engine.policy import plan_features

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


MAX_NUM_SEQS = max(plans.DECODE_BATCHES)  # the engine is configured for the largest batch the sweep measures
# and for a budget at which every pass graph exists (mixed-pass graphs reach min(budget, 1,024) tokens), so the
# profile predicts a budget-2,048 engine, the engine benchmark's, including its KV capacity
TOKEN_BUDGET = 2048


def make_engine(model: str, dtype: str, device: str, seed: int, block_size: int, gpu_memory_utilization: float):
    """The real engine, built as ``LLMEngine`` builds itself (so the KV capacity and the decode graphs are the
    engine's own), configured for up to ``MAX_NUM_SEQS`` sequences at ``TOKEN_BUDGET``."""
    from engine.config import EngineConfig
    from engine.llm import LLMEngine
    from engine.policy import PolicyConfig

    policy = PolicyConfig(max_num_batched_tokens=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS, block_size=block_size)
    return LLMEngine(EngineConfig(model, policy, dtype=DTYPES[dtype], device=device, seed=seed,
                                  gpu_memory_utilization=gpu_memory_utilization))


def _median_seconds(fn, repeats: int = 10) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def _time_op(op, shape_a, shape_b, device: torch.device) -> float:
    a = torch.randn(shape_a, device=device, dtype=torch.bfloat16)
    b = torch.randn(shape_b, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        op(a, b)
    return _median_seconds(lambda: op(a, b))


def device_ceilings(device: torch.device) -> dict:
    """Measured copy bandwidth (bytes read + written) and bf16 matmul rate, on random data."""
    if device.type != "cuda":
        return {"copy_bandwidth_Bps": None, "matmul_flops": None}
    n, m = 1 << 29, 8192  # a 1 GiB bf16 copy; an 8192^3 bf16 matrix product
    copy_s = _time_op(lambda x, y: y.copy_(x), (n,), (n,), device)
    mm_s = _time_op(lambda x, y: torch.matmul(x, y), (m, m), (m, m), device)
    torch.cuda.empty_cache()
    return {"copy_bandwidth_Bps": 2 * n * 2 / copy_s, "matmul_flops": 2 * m**3 / mm_s}


def git_commit() -> str:
    env = os.environ.get("SPLITFUSE_GIT_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict:
    from importlib import metadata

    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    try:
        out["engine"] = metadata.version("splitfuse")
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH (the device machine): read pyproject
        text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
        out["engine"] = next((ln.split('"')[1] for ln in text.splitlines() if ln.startswith("version")), None)
    return out


def sweep_meta(llm, model: str, dtype: str, device: torch.device, ceilings: dict) -> dict:
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    mem = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    return {"model": model, "card": card, "card_memory_bytes": mem, "dtype": dtype, "tensor_parallel": 1,
            "kind": "measured", "versions": versions(), "git_commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "block_size": llm.block_size, "num_kv_blocks": llm.num_kv_blocks,
            "max_model_len": llm.max_model_len, "max_num_seqs": MAX_NUM_SEQS, "token_budget": TOKEN_BUDGET,
            "mixed_graph_buckets": mixed_graph_buckets(llm), **ceilings,
            "timing": "wall_s = scheduler.schedule + median(runner.run, host clock with device sync) "
                      "+ scheduler.update; gpu_s = CUDA events around runner.run"}


def mixed_graph_buckets(llm) -> list[int]:
    """The token counts the engine's mixed-pass CUDA graphs pad to (empty without such graphs)."""
    return [int(b) for b in getattr(getattr(llm.runner, "graphs", None), "mixed_buckets", None) or []]


class PointTimer:
    """Times one pass: warm-up, then repeats until ``target_s`` of samples or ``max_repeats``."""

    def __init__(self, runner, device: torch.device, min_repeats: int = 3, max_repeats: int = 8,
                 target_s: float = 0.25, warmup: int = 1) -> None:
        self.runner, self.device = runner, device
        self.min_repeats, self.max_repeats, self.target_s, self.warmup = min_repeats, max_repeats, target_s, warmup
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def once(self, plan) -> tuple[float, float | None, list[int]]:
        start = end = None
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.sync()
        t0 = time.perf_counter()
        if start is not None:
            start.record()
        sampled = self.runner.run(plan)
        if end is not None:
            end.record()
        self.sync()
        wall = time.perf_counter() - t0
        gpu = start.elapsed_time(end) / 1e3 if start is not None else None
        return wall, gpu, sampled

    def time(self, plan) -> tuple[list[float], list[float], list[int]]:
        for _ in range(self.warmup):
            self.once(plan)
        walls, gpus = [], []
        wall, gpu, sampled = self.once(plan)
        walls.append(wall)
        gpus.append(gpu)
        n = min(self.max_repeats, max(self.min_repeats, math.ceil(self.target_s / max(wall, 1e-6))))
        for _ in range(n - 1):
            wall, gpu, sampled = self.once(plan)
            walls.append(wall)
            gpus.append(gpu)
        return walls, gpus, sampled


def energy_meter(device: torch.device):
    """An ``calibration.power.EnergyMeter`` of ``device``, or None (with the reason printed) where NVML does not
    answer: the sweep then measures no energy."""
    if device.type != "cuda":
        return None
    from calibration.power import card_meter

    return card_meter(device.index if device.index is not None else torch.cuda.current_device())


def pass_energy(timer: PointTimer, plan, meter, seconds: float) -> dict:
    """Joules and seconds per pass of ``plan`` replayed back to back (``timer``'s runner) for about ``seconds``
    (at least 10 passes) under ``meter``, an ``EnergyMeter``: NVML's counter updates too rarely to time one pass."""
    n = max(10, math.ceil(seconds / max(timer.once(plan)[0], 1e-6)))
    run = timer.runner.run
    with meter:
        t0 = time.perf_counter()
        for _ in range(n):
            run(plan)
        timer.sync()
        elapsed = time.perf_counter() - t0
    return {"joules": meter.joules / n, "energy_pass_s": elapsed / n, "energy_passes": n}


def measure(llm, spec: plans.PassSpec, timer: PointTimer, rng: np.random.Generator, meter=None,
            energy_s: float = 0.0, aged_kv: bool = False) -> dict:
    """One point: the plan built by the real scheduler (on an aged KV cache with ``aged_kv``), timed; then the
    scheduler's update, timed; with a ``meter``, also the pass's energy (``pass_energy``)."""
    sched, plan, sched_s = plans.build_plan(spec, llm.num_kv_blocks, llm.block_size, rng,
                                            llm.model_config.vocab_size, llm.max_model_len, aged_kv=aged_kv)
    try:
        walls, gpus, sampled = timer.time(plan)
        energy = pass_energy(timer, plan, meter, energy_s) if meter is not None and energy_s > 0 else {}
        t0 = time.perf_counter()
        sched.update(plan, sampled, 0.0)
        update_s = time.perf_counter() - t0
    finally:
        plans.release(sched)
    host = sched_s + update_s
    uses_graph = getattr(llm.runner, "uses_graph", None)
    padded_tokens = getattr(getattr(llm.runner, "graphs", None), "padded_tokens", None)
    point = {"sweep": spec.sweep, "key": spec.key, **plan_features(plan)._asdict(), "run_s": float(np.median(walls)),
             "sched_s": sched_s, "update_s": update_s, "wall_s": float(np.median(walls)) + host,
             "wall_repeats": [round(w + host, 7) for w in walls]}
    if uses_graph is not None:
        point["graph"] = bool(uses_graph(plan))
    point["graph_tokens"] = padded_tokens(plan) if padded_tokens is not None else None
    if gpus[0] is not None:
        point["gpu_s"] = float(np.median(gpus))
        point["gpu_repeats"] = [round(g, 7) for g in gpus]
    point.update(energy)
    return point


def read_points(path: Path) -> tuple[dict | None, list[dict]]:
    """(header, points) of a JSONL points file. Rounds of the same pass (measured at different times, so a
    slow spell of the host or the card does not decide a point alone) merge into one point over all repeats.
    A torn last line (killed mid-write) is dropped."""
    header, points = None, {}
    if not path.exists():
        return None, []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "header" in row:
            header = row["header"]
        elif row["key"] not in points:
            points[row["key"]] = {**row, "rounds": 1}
        else:
            p = points[row["key"]]
            p["rounds"] += 1
            for name in ("wall", "gpu"):
                if f"{name}_repeats" in row and f"{name}_repeats" in p:
                    p[f"{name}_repeats"] = p[f"{name}_repeats"] + row[f"{name}_repeats"]
                    p[f"{name}_s"] = float(np.median(p[f"{name}_repeats"]))
            if "joules" in row and "joules" in p:  # energy: per pass over all rounds' replays
                n, m = p["energy_passes"], row["energy_passes"]
                for key in ("joules", "energy_pass_s"):
                    p[key] = (p[key] * n + row[key] * m) / (n + m)
                p["energy_passes"] = n + m
    return header, list(points.values())


def run_sweep(model: str, dtype: str, points_path: Path, *, device: str = "cuda", seed: int = 0,
              block_size: int = 16, gpu_memory_utilization: float = 0.9, time_budget_s: float | None = None,
              max_points: int | None = None, progress: bool = True,
              specs: list[plans.PassSpec] | None = None, rounds: int = 1,
              energy_s: float = 0.25, kv_layout: str = "fresh", mixed_per_bucket: int = 0,
              only: Sequence[str] = ()) -> tuple[dict, list[dict]]:
    """Measure every pass (``plans.sweep_specs`` unless ``specs`` is given; of the sweep kinds in ``only`` where
    it names some) not yet in ``points_path``, until the time budget, until each is measured ``rounds`` times;
    returns (meta, all points). ``energy_s`` > 0: also
    each pass's energy where NVML answers (``pass_energy``; 0 measures none). ``kv_layout``: "fresh" (each pass's
    blocks handed out in order) or "aged" (scattered as a long-running server leaves them, ``plans.age_kv_cache``).
    ``mixed_per_bucket``: passes per mixed-graph bucket of ``plans.mixed_graph_specs`` in the default specs."""
    from tqdm import tqdm

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if kv_layout not in plans.KV_LAYOUTS:
        raise ValueError(f"unknown KV layout {kv_layout!r}; choose one of {', '.join(plans.KV_LAYOUTS)}")
    unknown = [k for k in only if k not in plans.SWEEP_KINDS]
    if unknown:
        raise ValueError(f"unknown sweep kind {unknown[0]!r}; kinds are {', '.join(plans.SWEEP_KINDS)}")
    points_path = Path(points_path)
    header, done = read_points(points_path)
    if header is not None and (header["model"], header["dtype"]) != (model, dtype):
        raise ValueError(f"{points_path} holds points of {header['model']} {header['dtype']}, not {model} {dtype}; "
                         f"choose another --out or delete it")
    torch.manual_seed(seed)
    llm = make_engine(model, dtype, device, seed, block_size, gpu_memory_utilization)
    dev = llm.device
    meter = energy_meter(dev) if energy_s > 0 else None
    if header is None:
        header = sweep_meta(llm, model, dtype, dev, device_ceilings(dev))
        header["kv_layout"] = kv_layout
        if meter is not None:
            from calibration.power import idle_watts

            header.update(idle_w=idle_watts(meter), power_limit_w=meter.limit_w)
        points_path.parent.mkdir(parents=True, exist_ok=True)
        with points_path.open("a") as f:
            f.write(json.dumps({"header": header}) + "\n")
    elif header.get("card") != (torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"):
        raise ValueError(f"{points_path} was measured on {header.get('card')!r}; resume it on the same card")
    elif header.get("mixed_graph_buckets", []) != mixed_graph_buckets(llm):
        raise ValueError(f"{points_path} was measured with mixed-graph buckets {header.get('mixed_graph_buckets')}, "
                         f"this engine has {mixed_graph_buckets(llm)}; choose another --out or delete it")
    elif header.get("kv_layout", "fresh") != kv_layout:
        raise ValueError(f"{points_path} was measured on a {header.get('kv_layout', 'fresh')} KV cache, not "
                         f"{kv_layout}; choose another --out or delete it")
    elif meter is not None and "idle_w" not in header:
        print(f"{points_path} was started without energy figures; its new points get none either", flush=True)
        meter = None
    if specs is None:
        specs = plans.sweep_specs(llm.max_model_len, llm.num_kv_blocks, llm.block_size, seed=seed,
                                  max_num_seqs=MAX_NUM_SEQS, mixed_buckets=mixed_graph_buckets(llm),
                                  per_bucket=mixed_per_bucket)
    if only:
        specs = [s for s in specs if s.sweep in only]
        if not specs:
            raise ValueError(f"no pass of kind {', '.join(only)} in this sweep (mixed-graph needs --mixed-per-bucket, "
                             "eager-mixed an engine with mixed graphs)")
    if max_points is not None:
        specs = specs[:max_points]
    count = {p["key"]: p["rounds"] for p in done}
    todo = [s for s in specs if count.get(s.key, 0) < rounds]
    timer = PointTimer(llm.runner, dev)
    rng = np.random.default_rng(seed + 1)
    _warm_up(llm, timer, rng)
    # Keep the engine's objects (hundreds of thousands with torch loaded) out of the garbage collections that
    # plans.build_plan runs before each timing: a full collection over them costs more than many a pass.
    gc.freeze()
    start = time.monotonic()
    try:
        with points_path.open("a") as f:
            for spec in tqdm(todo, desc=f"profile {model}", disable=not progress, unit="pass"):
                if time_budget_s is not None and time.monotonic() - start > time_budget_s:
                    break
                seconds = 0.0 if spec.sweep in plans.TIME_ONLY_SWEEPS else energy_s
                f.write(json.dumps(measure(llm, spec, timer, rng, meter, seconds, kv_layout == "aged")) + "\n")
                f.flush()
    finally:
        gc.unfreeze()
    return header, read_points(points_path)[1]


def _warm_up(llm, timer: PointTimer, rng: np.random.Generator) -> None:
    """Compile kernels and fill allocator pools with a few passes of each kind before timing anything."""
    top = llm.max_model_len - 1
    for spec in (plans.PassSpec("prefill", chunks=((0, min(2048, top), 0),)),
                 plans.PassSpec("decode", decode_contexts=(min(512, top - 1),) * 8),
                 plans.PassSpec("mixed", decode_contexts=(min(256, top - 1),) * 4,
                                chunks=((min(128, top // 2), 64, 8),))):
        if spec.blocks_needed(llm.block_size) <= llm.num_kv_blocks:
            sched, plan, _ = plans.build_plan(spec, llm.num_kv_blocks, llm.block_size, rng,
                                              llm.model_config.vocab_size, llm.max_model_len)
            try:
                for _ in range(3):
                    timer.once(plan)
            finally:
                plans.release(sched)
