"""What a run was: the profile, card, model, policy, cluster, workload, seeds, SLA and code version, as rows of
(name, value) that ``splitfuse simulate`` prints, ``summary.json`` keeps and ``report.html`` shows first."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

from sim.metrics import SLA
from sim.saturation import estimate_capacity
from sim.token_stats import EWM_SPAN
from sim.units import number
from sim.workload import Workload


def run_config(config, workload: Workload | None, seeds, sla: SLA, warmup: float = 0.0,
               cooldown: float = 0.0) -> dict[str, str]:
    """The rows of a run of ``workload`` on the ``sim.cluster.ClusterConfig`` ``config`` over ``seeds``."""
    cost = config.costs()[0]
    m = getattr(cost, "meta", {}) or {}
    policy = config.policy
    router = config.routed()
    rows = {
        "profile": _profile_name(getattr(cost, "source", None)) or m.get("kind", "?"),
        "model": str(m.get("model", "?")),
        "card": str(m.get("card", "?")),
        "dtype, tensor parallel": f"{m.get('dtype', '?')}, {m.get('tensor_parallel', '?')}",
        "profile kind": str(m.get("kind", "?")) + ("" if m.get("kind") == "measured" else " (NOT measured)"),
        "KV cache per replica": f"{cost.num_kv_blocks:,} blocks x {cost.block_size} tokens",
        "replicas": f"{config.replicas:,}",
        "scheduler": policy.scheduler,
        "token budget": f"{policy.max_num_batched_tokens:,} tokens per pass",
        "max sequences per pass": f"{policy.max_num_seqs:,}",
        "prefix caching": "on" if policy.enable_prefix_caching else "off",
        "balancer": policy.balancer,
        "router": (f"+{router.admission_s * 1e3:.2f} ms in, +{router.delivery_s * 1e3:.2f} ms out a token" if router
                   else "none (an ideal balancer)"),
        "pass-time noise": "from the profile's measured spread" if config.noise else "off (median pass times)",
    }
    if "host_factor" in m:
        rows["host"] = f"passes {number(m['host_factor'])} x the profile's price"
    if workload is not None:
        rows.update(_workload_rows(workload, config))
        rows["sampling"] = f"temperature {number(workload.temperature)}" + (
            (" (greedy: argmax in the graphs, decode steps enqueued ahead, as the profile prices them)"
             if getattr(cost, "greedy_seconds", None) is not None
             else " (greedy, priced as sampled: the profile has no greedy section)")
            if workload.temperature == 0 else "")
    seeds = list(seeds)
    rows["seeds"] = (f"{seeds[0]} to {seeds[-1]} ({len(seeds)} replications)" if len(seeds) > 1
                     else f"{seeds[0]} (1 replication: no confidence intervals)")
    rows["measured requests"] = (f"all but the first {warmup:.0%} and the last {cooldown:.0%} by arrival"
                                 if warmup or cooldown else "all")
    rows["SLA"] = (f"first token within prompt tokens / {number(sla.prompt_tokens_per_s)} s; generation at "
                   f"{number(sla.generation_rate)} tokens/s ("
                   + ("cumulative" if sla.cumulative else f"EWM of token gaps, span {EWM_SPAN}") + ")")
    if sla.goodput:
        rows["goodput limits"] = ", ".join(f"{k} {number(v * 1e3)} ms" for k, v in sla.goodput.items())
    rows["commit"] = code_version()
    rows["generated"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return rows


def _workload_rows(workload: Workload, config) -> dict[str, str]:
    capacity = estimate_capacity(config, workload)
    cap = f", at most {workload.max_concurrency:,} in flight" if workload.max_concurrency else ""
    if workload.arrivals == "trace":
        table = workload.generate(0)
        span = float(table.arrivals[-1] - table.arrivals[0])
        offered = (len(table) - 1) / span if span > 0 else float("nan")
        prompt, output = workload.mean_lengths()
        return {"arrivals": f"trace {workload.trace}: {len(table):,} requests over {number(span)} s{cap}",
                "rate": f"{number(offered)} req/s offered, {offered / capacity:.0%} of the estimated capacity "
                        f"{number(capacity)} req/s",
                "lengths": f"the trace's: mean prompt {number(prompt)}, mean output {number(output)} tokens"}
    clip = f", clipped at {workload.max_prompt_tokens:,}" if workload.max_prompt_tokens else ""
    rows = {"arrivals": workload.arrivals + (f" (cv {number(workload.cv)})" if workload.arrivals == "gamma" else "")
            + (f", {workload.clients:,} clients" if workload.arrivals == "closed" else "")
            + cap,
            "requests per replication": f"{workload.num_requests:,}",
            "lengths": f"prompt {workload.prompt}{clip}; output {workload.output} (tokens)"}
    if workload.rate is not None:
        rows["rate"] = (f"{number(workload.rate)} req/s, {workload.rate / capacity:.0%} of the estimated capacity "
                        f"{number(capacity)} req/s")
    return rows


def _profile_name(source: str | None) -> str | None:
    """A shipped profile by its file name (where it lives is known), any other by its path."""
    if source is None:
        return None
    from calibration.profile import PROFILES_DIR

    path = Path(source).resolve()
    return f"{path.name} (shipped)" if path.parent == PROFILES_DIR.resolve() else str(source)


def code_version() -> str:
    """The git commit of this checkout (noting uncommitted changes), else the installed version."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return head.stdout.strip() + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"splitfuse {version('splitfuse')} (not a git checkout)"
    except PackageNotFoundError:
        return "unknown (not a git checkout, not installed)"
