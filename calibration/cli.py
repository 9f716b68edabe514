"""``splitfuse profile``: sweep a GPU into a profile, refit saved points, check a profile, or plot one."""

from __future__ import annotations

from pathlib import Path

import click

from calibration.plans import KV_LAYOUTS, SWEEP_KINDS

DTYPE_CHOICES = ("bf16", "fp16", "fp32")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _row(name, n, median, p95, top) -> str:
    return f"{name:<10} {n:>5} {median:>8} {p95:>8} {top:>8}"


def _stats_row(name: str, s: dict) -> str:
    return _row(name, s.get("n", 0), _pct(s.get("median_abs_rel_err")), _pct(s.get("p95_abs_rel_err")),
                _pct(s.get("max_abs_rel_err")))


def check_report(profile) -> str:
    """Held-out error (overall, per sweep, per path), KV capacity, paths and provenance: what ``--check`` prints."""
    m, fit = profile.meta, profile.fit
    lines = [f"profile: {m.get('model')} on {m.get('card')} ({m.get('dtype')}, tp={m.get('tensor_parallel')}), "
             f"kind={m.get('kind')}, date={m.get('date')}, commit={str(m.get('git_commit', '-'))[:12]}",
             f"KV capacity: {profile.num_kv_blocks} blocks x {profile.block_size} tokens = "
             f"{profile.num_kv_blocks * profile.block_size} tokens; max_model_len {profile.max_model_len}",
             f"points: {len(profile.points)} ({fit.get('train', {}).get('n', 0)} fit, "
             f"{fit.get('heldout', {}).get('n', 0)} held out); target {fit.get('target')}",
             _row("held-out", "n", "median", "p95", "max")]
    lines += [_stats_row(name, s) for name, s in
              [("all", fit.get("heldout", {}))] + sorted(fit.get("heldout_by_sweep", {}).items())]
    if fit.get("heldout_by_path"):  # profiles fitted before per-path stats have none
        lines.append(_row("by path", "n", "median", "p95", "max"))
        lines += [_stats_row(name, s) for name, s in fit["heldout_by_path"].items()]
    held = fit.get("heldout", {})
    ok = held.get("median_abs_rel_err") is not None and held["median_abs_rel_err"] <= 0.03 \
        and held["p95_abs_rel_err"] <= 0.08
    lines.append(f"target (median <= 3%, p95 <= 8%): {'met' if ok else 'NOT met'}")
    model = profile.model
    buckets = model.mixed_buckets if model.mixed is not None else []
    table = model.decode_table
    lines.append(f"paths: decode graph up to {model.graph_max_batch} sequences"
                 + (f" (a decode table of {len(table.seqs)} batch sizes, {table.seqs[0]}-{table.seqs[-1]})"
                    if table is not None else "") + ", "
                 + (f"mixed graph up to {buckets[-1]} tokens ({len(buckets)} buckets), " if buckets else "")
                 + "eager otherwise")
    if fit.get("path_mismatches"):
        lines.append(f"WARNING: {fit['path_mismatches']} points ran another path (graph or not, padded tokens) "
                     "than the model assumes: the engine and the profile's metadata disagree")
    lines.append(energy_line(profile.energy))
    lines.append(hosts_line(profile))
    if m.get("kind") != "measured":
        lines.append("NOTE: this profile is not measured on a GPU (" + str(m.get("note", m.get("kind"))) + ")")
    return "\n".join(lines)


def hosts_line(profile) -> str:
    """What ``--check`` says of a profile's measured hosts."""
    from calibration.host_spread import HOST_QUANTILE

    if profile.hosts is None:
        return "hosts: none measured against it (`splitfuse plan` plans on its own passes)"
    hosts = profile.hosts
    factors = hosts.factors()
    retired = len(hosts.runs) - len(hosts.active)
    spread = (f"{len(factors)} measured, simulated / served requests/s {min(factors.values()):.3f}-"
              f"{max(factors.values()):.3f} (a host's mean over its runs)" if factors else "none measured now")
    kept = f"; {retired} runs retired ({'; '.join(dict.fromkeys(r.retired for r in hosts.runs if r.retired))})" \
        if retired else ""
    card = profile.card_spread()
    bound = (f" or a new host's {HOST_QUANTILE:.0%} bound, with the card's spread ({card.sd:.2%} in log factor, "
             f"{card.dof} degrees of freedom, each GPU counted once)" if card is not None else "")
    return (f"hosts: {spread}{kept}; `splitfuse plan` plans for passes as slow as the slowest run of the workload's "
            f"mix{bound}: {hosts.describe_margins(card)}")


def energy_line(energy) -> str:
    """What ``--check`` says of a profile's energy section."""
    if energy is None:
        return "energy: none (the simulator reports no energy for this profile)"
    f, c = energy.fit, energy.coef
    held = f.get("heldout", {})
    err = (f"held-out median {_pct(held.get('median_abs_rel_err'))}, p95 {_pct(held.get('p95_abs_rel_err'))}"
           if held else f"fit median {_pct(f.get('median_abs_rel_err'))}, max {_pct(f.get('max_abs_rel_err'))}")
    if "loo_median_abs_rel_err" in f:
        err += f", leave-one-out median {_pct(f['loo_median_abs_rel_err'])}, max {_pct(f['loo_max_abs_rel_err'])}"
    return (f"energy: idle {energy.idle_w:.0f} W + {c['intercept']:.3g} J a pass + {c['tokens'] * 1e3:.3g} mJ a token "
            f"+ {c['decode_context'] * 1e6:.3g} uJ a decode context token; {f.get('passes', '?')} passes from "
            f"{f.get('source', '?')}; {err}")


def points_path_for(out: Path) -> Path:
    return out.with_name(out.stem + ".points.jsonl")


def fit_points_file(points_path: Path, out: Path, seed: int = 0):
    from calibration.fitting import build_profile
    from calibration.sweep import read_points

    header, points = read_points(points_path)
    if header is None:
        raise click.ClickException(f"{points_path}: no header line; not a points file of `splitfuse profile`")
    try:
        profile = build_profile(points, header, header["block_size"], header["num_kv_blocks"],
                                header["max_model_len"], seed=seed)
        profile.save(out)
    except (ValueError, KeyError) as e:
        raise click.ClickException(f"{points_path}: cannot fit: {e} (too few or too noisy points? measure more "
                                   "passes)") from None
    return profile


@click.command("profile")
@click.option("--model", help="Preset name (random weights) or a Hugging Face checkpoint directory.")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="bf16", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Profile file to write; measured points go beside it, in <OUT stem>.points.jsonl (resumable).")
@click.option("--check", "check_path", metavar="FILE|NAME", help="Print a profile's held-out error and KV capacity.")
@click.option("--from-points", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Refit a saved points file (from an earlier sweep) into --out, without a GPU.")
@click.option("--refit", "refit_path", metavar="FILE|NAME",
              help="Fit a profile again from its own points with this code into --out, keeping its meta, serving, "
                   "energy and hosts sections (after a change to the fitting; no GPU).")
@click.option("--add-points", "add_points", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="With --refit: fit the profile's points together with this points file, measured on the same card "
                   "(for instance one sweep kind re-measured with --only), recording it in the profile's meta.")
@click.option("--retire-hosts", "retire_path", metavar="FILE|NAME",
              help="Write the profile into --out with its measured hosts' runs on the engines of --engine retired "
                   "(--because says why): kept on record, they set no margin of `splitfuse plan` any more.")
@click.option("--engine", "engines", multiple=True, metavar="COMMIT",
              help="With --retire-hosts: an engine commit whose runs to retire, as the runs record it (repeatable).")
@click.option("--because", default="", help="With --retire-hosts: why, in words (kept in each retired run).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="With --check: also write the profile's figures here (one offline HTML file; a PNG per figure "
                   "where kaleido finds a Chrome or Chromium).")
@click.option("--time-budget", type=click.FloatRange(min=1), help="Stop measuring new passes after this many s.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Measure each pass this many times, at different times (a rerun adds rounds).")
@click.option("--max-points", type=click.IntRange(min=1), help="Measure at most this many passes (smoke runs).")
@click.option("--device", default="cuda", show_default=True, help="Torch device (cpu only for smoke runs).")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.05, 1.0), default=0.9, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--energy-seconds", type=click.FloatRange(min=0), default=0.25, show_default=True,
              help="Replay each pass back to back this long under NVML's energy counter for its joules (0: no "
                   "energy; skipped where nvidia-ml-py or NVML is missing).")
@click.option("--kv-layout", type=click.Choice(KV_LAYOUTS), default="fresh", show_default=True,
              help="Time passes on a fresh KV cache (blocks in order) or on one aged as a server ages it.")
@click.option("--mixed-per-bucket", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also this many mixed passes per mixed-graph bucket, as SplitFuse serves them (any decode count, "
                   "chunks at any prefix). Off by default: the mixed model does not fit them well yet "
                   "(calibration/README.md).")
@click.option("--only", type=click.Choice(SWEEP_KINDS), multiple=True,
              help="Measure only passes of this sweep kind (repeatable); for instance eager-mixed, the SplitFuse "
                   "passes of budgets over 1,024 tokens, to add to a profile with --refit ... --add-points.")
@click.option("--no-fit", is_flag=True, help="Only measure points (fit later with --from-points).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def profile(model, dtype, out, check_path, from_points, refit_path, retire_path, engines, because, add_points, plot_dir,
            time_budget, rounds,
            max_points, device, block_size, gpu_memory_utilization, seed, energy_seconds, kv_layout, mixed_per_bucket,
            only, no_fit, no_progress):
    """Profile a GPU into a cost model (--model ... --out FILE), refit points (--from-points) or a profile
    (--refit), or --check FILE."""
    from calibration.profile import load_profile

    if (engines or because) and not retire_path:
        raise click.UsageError("--engine and --because go with --retire-hosts")
    if check_path:
        if model or from_points:
            raise click.UsageError("--check takes only a profile (and optionally --plot); drop --model/--from-points")
        try:
            prof = load_profile(check_path)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        click.echo(check_report(prof))
        if plot_dir:
            from calibration.plots import write_plots

            for path in write_plots(prof, plot_dir):
                click.echo(f"wrote {path}")
        return
    if plot_dir:
        raise click.UsageError("--plot goes with --check")
    if add_points and not refit_path:
        raise click.UsageError("--add-points goes with --refit")
    if out is None:
        raise click.UsageError("--out FILE is required (or use --check FILE)")
    if retire_path:
        if model or from_points or refit_path:
            raise click.UsageError("--retire-hosts takes a profile, --engine, --because and --out; drop the rest")
        if not engines:
            raise click.UsageError("--retire-hosts needs --engine COMMIT: the engines whose runs to retire")
        try:
            prof = load_profile(retire_path)
            if prof.hosts is None:
                raise ValueError(f"{retire_path}: no measured hosts to retire")
            unknown = set(engines) - {run.commit for run in prof.hosts.runs}
            if unknown:
                raise ValueError(f"--engine {', '.join(sorted(unknown))}: no run of {retire_path} was served by it")
            prof = prof.with_hosts(prof.hosts.retire(set(engines), because))
            prof.save(out)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        click.echo(hosts_line(prof))
        click.echo(f"wrote {out}")
        return
    if refit_path:
        if model or from_points:
            raise click.UsageError("--refit takes only a profile and --out; drop --model/--from-points")
        from calibration.fitting import refit
        from calibration.sweep import read_points

        try:
            prof = refit(load_profile(refit_path), read_points(add_points) if add_points else None)
            prof.save(out)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        click.echo(check_report(prof))
        click.echo(f"wrote {out}")
        return
    if from_points:
        if model:
            raise click.UsageError("--from-points refits saved points; drop --model")
        prof = fit_points_file(from_points, out, seed)
        click.echo(check_report(prof))
        return
    if not model:
        raise click.UsageError("--model PRESET|PATH is required (or use --check FILE / --from-points FILE)")
    from engine.presets import resolve_model

    try:
        resolve_model(model)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--model") from None
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise click.ClickException("no CUDA GPU here: profiling times real passes on a GPU "
                                       "(--device cpu only for smoke runs)")
    from calibration.sweep import run_sweep

    points_path = points_path_for(out)
    try:
        header, points = run_sweep(model, dtype, points_path, device=device, seed=seed, block_size=block_size,
                                   gpu_memory_utilization=gpu_memory_utilization, time_budget_s=time_budget,
                                   max_points=max_points, progress=not no_progress, rounds=rounds,
                                   energy_s=energy_seconds, kv_layout=kv_layout, mixed_per_bucket=mixed_per_bucket,
                                   only=only)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{len(points)} points in {points_path}")
    if no_fit:
        return
    prof = fit_points_file(points_path, out, seed)
    click.echo(check_report(prof))
    click.echo(f"wrote {out}")
