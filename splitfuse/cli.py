"""The ``splitfuse`` command. Subcommands live beside what they drive and are imported only when used, so
``splitfuse simulate`` never imports torch and runs on a core install (``pip install splitfuse``); a subcommand
that needs an extra says which one to install."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

# name: (module, attribute, help, the extra it needs or None for the core install)
SUBCOMMANDS = {
    "generate": ("engine.generate_cli", "generate", "Generate text with the engine (LLM pipeline).", "engine"),
    "simulate": ("sim.cli", "simulate", "Simulate a cluster of replicas on a calibrated profile.", None),
    "plan": ("sim.plan_cli", "plan", "Find the cheapest fleet that meets an SLA at a target request rate.",
             None),
    "profile": ("calibration.cli", "profile", "Profile a GPU into a cost model, or --check a profile.", None),
    "serve": ("engine.server.cli", "serve", "Serve a model over an OpenAI-compatible HTTP API.", "server"),
    "bench": ("sim.bench_cli", "bench", "Benchmark any OpenAI-compatible server.", None),
    "validate": ("sim.validate", "validate", "Compare the simulator with the real engine behind its server.",
                 "server"),
}
# The modules each extra brings (pyproject.toml's optional-dependencies), by import name.
EXTRA_MODULES = {
    "engine": ("torch", "transformers", "safetensors"),
    "server": ("torch", "transformers", "safetensors", "fastapi", "uvicorn"),
    "gpu": ("triton",),
    "parquet": ("pyarrow",),
}


def install_hint(extra: str, missing: list[str]) -> str:
    return f"this needs the {extra} extra (missing: {', '.join(missing)}): pip install 'splitfuse[{extra}]'"


def missing_modules(extra: str) -> list[str]:
    return [m for m in EXTRA_MODULES[extra] if not _importable(m)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # an import hook that refuses it
        return False


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attr, _, extra = SUBCOMMANDS[name]
        missing = missing_modules(extra) if extra else []
        if missing:
            raise click.ClickException(f"splitfuse {name}: {install_hint(extra, missing)}")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUBCOMMANDS[name][2]) for name in sorted(SUBCOMMANDS)])


@click.group(cls=LazyGroup)
@click.version_option(package_name="splitfuse")
def cli() -> None:
    """splitfuse: an LLM serving engine with Dynamic SplitFuse, and a cluster simulator calibrated on it."""


def main() -> None:
    try:
        cli()
    except ModuleNotFoundError as e:  # a command of the core install reached a module of an extra
        root = (e.name or "").split(".")[0]
        extra = next((x for x, modules in EXTRA_MODULES.items() if root in modules), None)
        if extra is None:
            raise
        sys.exit(f"Error: {install_hint(extra, [root])}")
