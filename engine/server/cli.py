"""``splitfuse serve MODEL``: one engine behind the OpenAI-compatible server, or ``--replicas N`` engine
processes behind a router."""

from __future__ import annotations

import click

from engine.policy import BALANCERS


def engine_options(f):
    """Options passed on to ``LLMEngine`` (and to every replica)."""
    for decl, kw in reversed([
        ("--scheduler", dict(default="splitfuse", show_default=True, help="splitfuse | prefill-first | decode-first")),
        ("--token-budget", dict(type=int, default=768, show_default=True, help="Tokens per forward pass.")),
        ("--block-size", dict(type=int, default=16, show_default=True, help="Tokens per KV block.")),
        ("--max-num-seqs", dict(type=int, default=256, show_default=True, help="Most requests in a batch.")),
        ("--num-kv-blocks", dict(type=int, default=None, help="KV blocks (default: as memory allows).")),
        ("--max-model-len", dict(type=int, default=None, help="Cap on prompt + output tokens.")),
        ("--dtype", dict(default="auto", show_default=True)),
        ("--device", dict(default="auto", show_default=True, help="auto | cpu | cuda")),
        ("--seed", dict(type=int, default=0, show_default=True)),
        ("--no-prefix-caching", dict(is_flag=True, help="Turn prefix caching off.")),
    ]):
        f = click.option(decl, **kw)(f)
    return f


def engine_kwargs(opts: dict) -> dict:
    return dict(scheduler=opts["scheduler"], token_budget=opts["token_budget"], block_size=opts["block_size"],
                max_num_seqs=opts["max_num_seqs"], num_kv_blocks=opts["num_kv_blocks"], dtype=opts["dtype"],
                device=opts["device"], seed=opts["seed"], enable_prefix_caching=not opts["no_prefix_caching"],
                max_model_len=opts["max_model_len"])


@click.command()
@click.argument("model")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-model-name", default=None, help="Model name clients send (default: MODEL).")
@click.option("--max-waiting", type=int, default=1024, show_default=True,
              help="Waiting requests per engine before answering 429.")
@click.option("--replicas", type=int, default=1, show_default=True,
              help="Engine processes (one per GPU, or per CPU slot) behind a router.")
@click.option("--balancer", type=click.Choice(sorted(BALANCERS)), default="least-requests", show_default=True,
              help="Router policy (the simulator's load balancers).")
@click.option("--health-interval", type=float, default=1.0, show_default=True, help="Seconds between checks.")
@click.option("--threads", type=int, default=None, help="Torch CPU threads per engine (default: cores / replicas).")
@click.option("--log-level", default="warning", show_default=True)
@click.option("--engine-process/--no-engine-process", default=True, show_default=True,
              help="Run the engine in its own process (HTTP streaming never holds its GIL), else in a thread.")
@engine_options
def serve(model, host, port, served_model_name, max_waiting, replicas, balancer, health_interval, threads,
          log_level, engine_process, **opts):
    """Serve MODEL (a preset name or a Hugging Face directory) over an OpenAI-compatible HTTP API."""
    name = served_model_name or model
    if replicas < 1:
        raise click.BadParameter("must be >= 1", param_hint="--replicas")
    if replicas > 1:
        from engine.server.router import run_router

        run_router(model, name, host, port, replicas, balancer, health_interval, threads, log_level,
                   max_waiting, opts, engine_process=engine_process)
        return
    import uvicorn

    from engine.server.app import create_app

    if engine_process:
        from engine.server.engine_process import EngineSpec

        engine = EngineSpec(model, engine_kwargs(opts), threads)
    else:
        if threads:
            import torch

            torch.set_num_threads(threads)
        from engine.llm import LLMEngine

        try:
            engine = LLMEngine(model, **engine_kwargs(opts))
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    try:
        app = create_app(engine, name, max_waiting)
    except ValueError as e:  # the engine process could not build the engine
        raise click.UsageError(str(e)) from None
    uvicorn.run(app, host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    serve()
