"""The SLA flags shared by ``splitfuse simulate`` and ``splitfuse bench``, so both judge runs the same way; their
defaults are ``sim.metrics.SLA``'s."""

from __future__ import annotations

import click

from sim.metrics import SLA


def sla_options(command):
    """Add --sla-gen-rate, --sla-prompt-rate, --cumulative-sla and --goodput to a click command."""
    options = [
        click.option("--sla-gen-rate", default=SLA.generation_rate, show_default=True, type=float,
                     help="FastGen generation SLA, tokens/s (headline effective throughput)."),
        click.option("--sla-prompt-rate", default=SLA.prompt_tokens_per_s, show_default=True, type=float,
                     help="FastGen prompt SLA: first token within prompt_tokens / this seconds."),
        click.option("--cumulative-sla", is_flag=True,
                     help="FastGen's cumulative generation SLA instead of the EWM one."),
        click.option("--goodput", default=None, help="Goodput limits, e.g. ttft:2,tpot:0.1,e2e:20 (seconds)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
