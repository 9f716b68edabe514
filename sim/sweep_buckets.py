"""Write a profile with the graph buckets no served pass showed priced from its sweep
(``calibration.sweep_buckets``), its measured hosts' overload runs simulated again on it (``sim.validate.saved``).

    python -m sim.sweep_buckets llama-3-8b-h200-bf16 --reference 768 --out FILE
"""

from __future__ import annotations

from pathlib import Path

import click

from calibration.profile import load_profile
from calibration.sweep_buckets import with_sweep_buckets
from sim.validate import saved


@click.command()
@click.argument("profile")
@click.option("--reference", type=int, default=768, show_default=True,
              help="The bucket the section's levels were fitted at (the calibration runs' token budget).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def main(profile: str, reference: int, out: Path) -> None:
    """Fill PROFILE's missing factors per graph bucket from its sweep and write it to OUT."""
    try:
        filled = saved(with_sweep_buckets(load_profile(profile), reference), out)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    for path, factors in filled.serving.bucket_scale.items():
        new = filled.serving.fit["sweep_buckets"]["filled"].get(path, [])
        click.echo(f"{path}: " + ", ".join(f"{b}{'*' if b in new else ''} {f:.3f}" for b, f in factors.items()))
    click.echo(f"(* from the sweep) wrote {out}")


if __name__ == "__main__":
    main()
