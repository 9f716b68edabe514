"""What the benchmark scripts share: the metadata every result records, where result files go, writing them, and
``bench_graph`` (GPU time of calls replayed through one CUDA graph).

- ``run_metadata``: the card (``torch.cuda.get_device_name``, or "cpu" without CUDA), the host CPU, the versions of
  python, torch, CUDA, triton and transformers (those that import), the git commit (``SPLITFUSE_GIT_COMMIT``
  overrides ``git rev-parse HEAD``; "unknown" when neither answers) and the UTC date.
- ``result_path``: a result file is ``<benchmark>_<card>.json`` (card as ``card_tag``: h100, h200, cpu, ...),
  by default in ``benchmarks/results/``, which keeps the latest file per benchmark and card (history is in git);
  a path that is not an existing folder is a file the user named, written as given.
- ``write_results``: that file, as JSON, with the metadata under ``meta``.

Torch, triton and transformers are imported only when asked for, so CPU-only scripts (``sim_speed``) stay light.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import json
import os
import platform
import re
import subprocess
from pathlib import Path

from sim.host_facts import cpu_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CARD_TAGS = ("h200", "h100", "a100", "l40s")  # short names, tried in this order
COMMIT_ENV = "SPLITFUSE_GIT_COMMIT"  # for a copy of the tree without its .git (e.g. on a device machine)


def number_list(kind=int):
    """An argparse ``type``: "4,16,24" -> [4, 16, 24] (``kind`` converts each)."""
    return lambda text: [kind(x) for x in text.split(",") if x]


def card_name() -> str:
    """The CUDA card's name, or "cpu" where torch has no CUDA device."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def card_tag(card: str | None = None) -> str:
    """The short name of ``card`` (default: this machine's) for file names: h200, h100, ..., cpu, or the name in
    lower case with runs of other characters as "_"."""
    name = (card or card_name()).lower()
    return next((tag for tag in CARD_TAGS if tag in name), re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "cpu")


def git_commit() -> str:
    """``$SPLITFUSE_GIT_COMMIT`` if set, else ``git rev-parse HEAD`` of this checkout, else "unknown"."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # not installed, or broken on this machine: recorded as None
        return None


def _host_cpu() -> str:
    return f"{cpu_model()}, {os.cpu_count()} CPUs"


@functools.cache
def run_metadata() -> dict:
    """The run's card, host, versions, commit and date; computed once per process (the first call's date), so every
    write of one run records the same metadata."""
    torch_version = _version("torch")
    cuda = None
    if torch_version is not None:
        import torch

        cuda = torch.version.cuda
    return {"card": card_name(), "host": _host_cpu(), "python": platform.python_version(), "torch": torch_version,
            "cuda": cuda, "triton": _version("triton"), "transformers": _version("transformers"),
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def result_path(path_or_dir: str | Path | None, benchmark: str, card: str | None = None) -> Path:
    """Where ``benchmark``'s result goes: in an existing folder (None: ``benchmarks/results/``), the file
    ``<benchmark>_<card tag>.json``; any other path is the file itself, as given."""
    if path_or_dir is not None and not Path(path_or_dir).is_dir():
        return Path(path_or_dir)
    folder = RESULTS_DIR if path_or_dir is None else Path(path_or_dir)
    return folder / f"{benchmark}_{card_tag(card)}.json"


def write_results(path_or_name: str | Path | None, benchmark: str, rows_or_payload, *, card: str | None = None,
                  **extra) -> Path:
    """Write ``{"benchmark", "meta": run_metadata(), ...}`` as JSON to ``result_path(path_or_name, benchmark)``
    (folders made as needed) and return the path. ``rows_or_payload``: a list (stored as ``rows``) or a dict (its
    keys stored at the top level); ``extra`` keys are added beside them. ``card`` names the card the results are
    for where it is not this process's CUDA card (e.g. "cpu" for a CPU run on a GPU machine)."""
    payload = {"rows": rows_or_payload} if isinstance(rows_or_payload, list) else dict(rows_or_payload)
    meta = run_metadata()
    if card is not None:
        meta = {**meta, "card": card}
    path = result_path(path_or_name, benchmark, meta["card"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": benchmark, "meta": meta, **payload, **extra}, indent=1, default=str))
    return path


def bench_graph(fns) -> float:
    """Median microseconds per call of each of ``fns`` (one input set each), all captured into one CUDA graph and
    timed with ``triton.testing.do_bench``: no host overhead, and enough input sets defeat the L2."""
    import torch
    from triton.testing import do_bench

    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    return do_bench(graph.replay, warmup=10, rep=60, return_mode="median") * 1e3 / len(fns)
