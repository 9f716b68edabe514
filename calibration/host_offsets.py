"""Where each GPU sits about the shipped profiles' prices, and whether that is the GPU's or the run's: the evidence
behind how ``CardSpread`` counts its degrees of freedom (calibration/VALIDATION.md, fifty-second round).

A run's offset is its log factor (``MeasuredHost.factor``) less the mean of its profile's active runs of its mix.
If a card's hosts differed only run by run, one GPU's runs of two mixes, or of two models, would be unrelated; where
they sit on the same side of their means, the offset is the GPU's, and its runs are one draw of the card.

    python -m calibration.host_offsets          # every card of the shipped measured profiles
"""

from __future__ import annotations

import math

import click
import numpy as np
import pandas as pd

from calibration.host_spread import CardSpread, HostSpread
from calibration.profile import load_profile, shipped_profiles


def offset_frame(profiles) -> pd.DataFrame:
    """One row per active run of ``profiles`` (measured ones with hosts): card, profile, mix, scheduler, host (the
    GPU) and offset (its log factor less its profile's mean for the mix and the scheduler that served it)."""
    rows = []
    for p in profiles:
        for (mix, scheduler), logs in p.hosts.groups().items():
            mean = sum(logs) / len(logs)
            rows += [{"card": p.meta.get("card"), "profile": p.meta.get("model"), "mix": mix, "scheduler": scheduler,
                      "host": run.host, "offset": math.log(run.factor) - mean} for run in p.hosts.active
                     if (run.mix, run.scheduler) == (mix, scheduler)]
    return pd.DataFrame(rows, columns=["card", "profile", "mix", "scheduler", "host", "offset"])


def mixes_agreement(offsets: pd.DataFrame, first: str = "long", second: str = "short") -> tuple[float, int]:
    """(Pearson's r, pairs) of one GPU's offsets in two mixes of one profile, over the GPU-profile pairs that ran
    both."""
    wide = offsets.pivot_table(index=["profile", "host"], columns="mix", values="offset").dropna(
        subset=[first, second])
    r = float(np.corrcoef(wide[first], wide[second])[0, 1]) if len(wide) > 2 else math.nan
    return r, len(wide)


def models_agreement(offsets: pd.DataFrame) -> pd.DataFrame:
    """Each GPU measured on more than one model: its mean offset (over mixes) on each, in points of log factor."""
    per_model = offsets.groupby(["host", "profile"])["offset"].mean().mul(100).unstack()
    return per_model[per_model.notna().sum(axis=1) > 1]


def held_out(profiles) -> pd.DataFrame:
    """Each GPU left out in turn: one row per active run of it, with the margin (``HostSpread.margin``) the other
    GPUs' runs set for its profile and mix, with their card's spread pooled without it, and the typical host's
    excess they read (``HostSpread.typical``, less 1). ``profiles``: one card's
    measured profiles with hosts. A run whose profile has no other run of its mix is not judged."""
    rows = []
    for gpu in sorted({run.host for p in profiles for run in p.hosts.active}):
        rest = [(p, tuple(run for run in p.hosts.active if run.host != gpu)) for p in profiles]
        spreads = {p.meta.get("model"): HostSpread(runs) for p, runs in rest if runs}
        card = CardSpread.pooled(list(spreads.values()))
        for p, _ in rest:
            others = spreads.get(p.meta.get("model"))
            for run in (run for run in p.hosts.active if run.host == gpu):
                if others is not None and run.mix in others.by_mix():
                    rows.append({"host": gpu, "profile": p.meta.get("model"), "mix": run.mix,
                                 "excess": run.factor - 1,
                                 "margin": others.margin(run.mix, card, scheduler=run.scheduler),
                                 "typical": others.typical(run.mix, run.scheduler) - 1})
    return pd.DataFrame(rows, columns=["host", "profile", "mix", "excess", "margin", "typical"])


def typical_error(judged: pd.DataFrame) -> tuple[float, float]:
    """(mean |log factor| of the held-out runs on the profile as swept, the same once each is divided by the
    typical factor the other GPUs read): how far a capacity estimate sits from a new host before and after it is
    centred on the measured ones."""
    excess, typical = np.log1p(judged["excess"]), np.log1p(judged["typical"])
    return float(excess.abs().mean()), float((excess - typical).abs().mean())


def _markdown(table: pd.DataFrame) -> str:
    """``table`` in points to two decimals, its missing cells blank."""
    return table.astype(object).where(table.notna(), None).to_markdown(floatfmt="+.2f", missingval="")


@click.command()
def main() -> None:
    """Print each card's offsets by GPU, how a GPU's mixes and models agree, how its runs fare against the
    margin the other GPUs set, and its pooled spread."""
    profiles = [p for p in map(load_profile, shipped_profiles())
                if p.meta.get("kind") == "measured" and p.hosts is not None]
    offsets = offset_frame(profiles)
    for card, part in offsets.groupby("card"):
        click.echo(f"\n## {card}: offsets by GPU (points of log factor)\n")
        table = part.assign(offset=part["offset"] * 100).pivot_table(index="host", columns=["profile", "mix"],
                                                                       values="offset")
        table.columns = [f"{profile} {mix}" for profile, mix in table.columns]
        click.echo(_markdown(table))
        r, pairs = mixes_agreement(part)
        click.echo(f"\none GPU's long- and short-mix offsets in one profile: r = {r:+.2f} over {pairs} GPUs")
        models = models_agreement(part)
        if len(models):
            click.echo("GPUs measured on several models (mean offset, points):\n")
            click.echo(_markdown(models))
        mine = [p for p in profiles if p.meta.get("card") == card]
        judged = held_out(mine)
        if len(judged):
            slack = judged["margin"] - judged["excess"]
            low = slack.min()
            edge = f"the closest {low:.2%} under it" if low >= 0 else f"the worst {-low:.2%} over it"
            click.echo(f"each GPU left out: {(slack >= 0).sum()} of {len(judged)} of its runs within the margin the "
                       f"other GPUs set ({edge})")
            swept, centred = typical_error(judged)
            click.echo(f"its runs' capacity off the profile, mean |log factor|: {swept:.2%} as swept, {centred:.2%} "
                       f"on the typical host the other GPUs read")
        spread = CardSpread.pooled([p.hosts for p in mine])
        runs = len(part) - part.groupby(["profile", "mix", "scheduler"]).ngroups
        gpus, models = part["host"].nunique(), part["profile"].nunique()
        click.echo(f"\npooled spread: {'none' if spread is None else f'{spread.sd:.2%}, {spread.dof}'} degrees of "
                   f"freedom ({gpus} GPUs less {models} profile{'s' * (models != 1)}; {runs} counted by run)")


if __name__ == "__main__":
    main()
