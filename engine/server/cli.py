"""``splitfuse serve MODEL``: one engine behind the OpenAI-compatible server, or ``--replicas N`` engine
processes behind a router (or a router over running servers: ``--replica-url``). Engine and policy options come
from ``EngineConfig`` and ``PolicyConfig``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from engine.config import EngineConfig
from engine.policy import PolicyConfig, make_balancer, scheduler_class
from engine.policy.options import config_options, pick
from engine.server.config import API_KEY_ENV, ServerConfig


def engine_options(options: dict) -> dict:
    """The entries of the command's options that build the engine (``LLMEngine(model, **these)``)."""
    return {**pick(PolicyConfig, options), **pick(EngineConfig, options)}


@click.command()
@click.argument("model")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-model-name", default=None,
              help="Model name clients send and responses show (default: MODEL's last path part).")
@click.option("--max-waiting", type=int, default=1024, show_default=True,
              help="Waiting requests per engine before answering 429.")
@click.option("--replicas", type=int, default=1, show_default=True,
              help="Engine processes (one per GPU, or per CPU slot) behind a router.")
@click.option("--threads", type=int, default=None, help="Torch CPU threads per engine (default: cores / replicas).")
@click.option("--log-level", default="warning", show_default=True)
@click.option("--engine-process/--no-engine-process", default=True, show_default=True,
              help="Run the engine in its own process (HTTP streaming never holds its GIL), else in a thread.")
@click.option("--replica-url", "replica_urls", multiple=True,
              help="Route to this running server instead of starting replicas (repeat for each; --balancer picks).")
@click.option("--pass-trace", type=click.Path(dir_okay=False), default=None,
              help="Write the engine's pass-level trace (JSON lines) to this file when the server stops.")
@config_options(ServerConfig)
@config_options(PolicyConfig)
@config_options(EngineConfig)
def serve(model, host, port, served_model_name, max_waiting, replicas, threads, log_level,
          engine_process, replica_urls, pass_trace, **options):
    """Serve MODEL (a preset name or a Hugging Face directory) over an OpenAI-compatible HTTP API.

    Exits with code 1 when the engine process dies, so that a supervisor (systemd, Kubernetes, or the router of
    --replicas) restarts it; on SIGTERM it drains (--shutdown-timeout)."""
    name = served_model_name or Path(model.rstrip("/")).name or model
    if replicas < 1:
        raise click.BadParameter("must be >= 1", param_hint="--replicas")
    server_options = pick(ServerConfig, options)
    server_options["api_key"] = server_options.get("api_key") or os.environ.get(API_KEY_ENV) or None
    try:
        http = ServerConfig(**server_options)
        http.check()
        config = EngineConfig.from_kwargs(model, **engine_options(options))
        scheduler_class(config.policy.scheduler), make_balancer(config.policy.balancer)  # fail fast on a bad name
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if pass_trace and (replicas > 1 or replica_urls or not engine_process):
        raise click.UsageError("--pass-trace needs one replica with --engine-process")
    if replica_urls and replicas > 1:
        raise click.UsageError("give --replicas (replicas started here) or --replica-url (running ones), not both")
    if replicas > 1 or replica_urls:
        from engine.server.router import run_router

        run_router(config, name, host, port, replicas, threads, log_level, max_waiting,
                   engine_process=engine_process, replica_urls=replica_urls, http=http)
        return
    from engine.server.app import create_app
    from engine.server.http import run_http

    if engine_process:
        from engine.server.engine_core import EngineSpec

        engine = EngineSpec(model, engine_options(options), threads, pass_trace=pass_trace)
    else:
        if threads:
            import torch

            torch.set_num_threads(threads)
        from engine.llm import LLMEngine

        try:
            engine = LLMEngine(config)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    try:
        app = create_app(engine, name, max_waiting, http, aliases=(model,))
    except ValueError as e:  # the engine process could not build the engine
        raise click.UsageError(str(e)) from None
    code = run_http(app, host, port, log_level, http, service=app.state.server)
    if code:
        click.echo("splitfuse serve: the engine died; exiting with code 1 for a supervisor to restart", err=True)
        sys.exit(code)


if __name__ == "__main__":
    serve()
