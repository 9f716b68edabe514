"""Where independent simulations run: local worker processes (``concurrent.futures``) or a Ray cluster.

``run_map(fn, items)`` is ``[fn(item) for item in items]`` in order, whatever the backend: each item carries its own
seed, so a table is the same on one process, many processes or a Ray cluster. Ray is the scheduler for a cluster;
nothing here schedules work itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

BACKENDS = ("local", "ray")


def run_map(fn: Callable, items: Iterable, backend: str = "local", processes: int | None = None,
            ray_address: str | None = None, progress: str | None = None) -> list:
    """``fn`` over ``items``, results in the items' order. ``fn`` must be picklable (a module-level function).

    ``local``: a ``ProcessPoolExecutor`` of ``processes`` workers (None: one per CPU); one worker or one item runs
    in this process. ``ray``: one Ray task per item on the cluster at ``ray_address`` (None: the one this process
    is connected to, else a new local instance), ``processes`` ignored (Ray places the tasks). ``progress``: a
    progress bar with this description, counting finished items."""
    items = list(items)
    if backend not in BACKENDS:
        raise ValueError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if processes is not None and processes < 1:
        raise ValueError(f"--processes must be >= 1, got {processes}")
    if ray_address is not None and backend != "ray":
        raise ValueError("--ray-address needs --backend ray")
    if backend == "ray":
        return _bar(_ray_map(fn, items, ray_address), len(items), progress)
    workers = min(processes or os.cpu_count() or 1, len(items))
    if workers <= 1:
        return _bar(map(fn, items), len(items), progress)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        return _bar(pool.map(fn, items), len(items), progress)


def _bar(results, total: int, progress: str | None) -> list:
    if not progress:
        return list(results)
    from tqdm.auto import tqdm  # a widget in Jupyter, text on a terminal

    return list(tqdm(results, total=total, desc=progress, leave=False))


def _ray_map(fn: Callable, items: list, address: str | None):
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install 'splitfuse[ray]'") from None
    if not ray.is_initialized():
        # The workers import this checkout's modules (the driver's working directory and path).
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(_import_roots())}})
    remote = ray.remote(fn)
    for ref in [remote.remote(item) for item in items]:
        yield ray.get(ref)


def _import_roots() -> list[str]:
    """The directories this project is imported from (so Ray workers find the same code)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra = os.environ.get("PYTHONPATH", "")
    return [root] + [p for p in extra.split(os.pathsep) if p and p != root]
