"""The SLA flags shared by ``splitfuse simulate`` and ``splitfuse bench``, so both judge runs the same way; their
defaults are ``sim.metrics.SLA``'s."""

from __future__ import annotations

import functools

import click

from sim.metrics import SLA, parse_goodput

# A command with ``sla_options`` takes extra arguments: the further KEY:VALUE pairs of ``--goodput ttft:200 tpot:50``
# (argparse's nargs="+", which click options lack).
SLA_CONTEXT = {"allow_extra_args": True}


def sla_options(command):
    """Add --sla-gen-rate, --sla-prompt-rate, --cumulative-sla and --goodput to a click command (made with
    ``context_settings=SLA_CONTEXT``); the command receives ``goodput`` parsed (``parse_goodput``: seconds)."""
    options = [
        click.option("--sla-gen-rate", default=SLA.generation_rate, show_default=True, type=float,
                     help="FastGen generation SLA, tokens/s (headline effective throughput)."),
        click.option("--sla-prompt-rate", default=SLA.prompt_tokens_per_s, show_default=True, type=float,
                     help="FastGen prompt SLA: first token within prompt_tokens / this seconds."),
        click.option("--cumulative-sla", is_flag=True,
                     help="FastGen's cumulative generation SLA instead of the EWM one."),
        click.option("--goodput", default=None,
                     help="Goodput limits as vllm bench serve takes them: KEY:MILLISECONDS pairs, e.g. "
                          "--goodput ttft:200 tpot:50 e2el:20000."),
    ]

    @functools.wraps(command)
    def with_goodput(*args, goodput, **kwargs):
        extra = click.get_current_context().args
        if extra and goodput is None:
            raise click.UsageError(f"unexpected argument(s): {' '.join(extra)}")
        try:
            limits = parse_goodput([goodput, *extra] if goodput is not None else None)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--goodput'") from None
        return command(*args, goodput=limits, **kwargs)

    for option in reversed(options):
        with_goodput = option(with_goodput)
    return with_goodput
