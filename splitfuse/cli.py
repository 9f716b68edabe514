"""The ``splitfuse`` command. Subcommands live beside what they drive and are imported only when used,
so ``splitfuse simulate`` never imports torch."""

from __future__ import annotations

import importlib

import click

SUBCOMMANDS = {
    "generate": ("engine.generate_cli", "generate", "Generate text with the engine (LLM pipeline)."),
    "simulate": ("sim.cli", "simulate", "Simulate a cluster of replicas on a calibrated profile."),
    "plan": ("sim.plan_cli", "plan", "Find the cheapest fleet that meets an SLA at a target request rate."),
    "profile": ("calibration.cli", "profile", "Profile a GPU into a cost model, or --check a profile."),
    "serve": ("engine.server.cli", "serve", "Serve a model over an OpenAI-compatible HTTP API."),
    "bench": ("sim.bench", "bench", "Benchmark any OpenAI-compatible server."),
    "validate": ("sim.validate", "validate", "Compare the simulator with the real engine behind its server."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attr, _ = SUBCOMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUBCOMMANDS[name][2]) for name in sorted(SUBCOMMANDS)])


@click.group(cls=LazyGroup)
@click.version_option(package_name="splitfuse")
def cli() -> None:
    """splitfuse: an LLM serving engine with Dynamic SplitFuse, and a cluster simulator calibrated on it."""


def main() -> None:
    cli()
