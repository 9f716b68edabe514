"""The flags that choose where independent simulations run (``sim.parallel.run_map``), shared by
``splitfuse simulate`` and ``splitfuse plan``."""

from __future__ import annotations

import click

from sim.parallel import BACKENDS


def backend_options(command):
    """Add --backend, --processes and --ray-address to a click command."""
    options = [
        click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True,
                     help="Where sweeps and searches run: local worker processes, or a Ray cluster."),
        click.option("--processes", type=int, default=None,
                     help="Local backend: worker processes (default: one per CPU)."),
        click.option("--ray-address", default=None,
                     help="Ray backend: the cluster to join (default: a new local Ray instance)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
