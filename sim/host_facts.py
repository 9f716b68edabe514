"""What a validation run records of the machine it measured on, so that runs can be told apart by host and card
(hosts of one card differ by several percent): host name, CPU model and count, and the CUDA cards this process may
use, each with its name and UUID as ``nvidia-smi`` reports them."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from collections.abc import Callable, Mapping

GpuRow = tuple[str, str, str]  # (index, uuid, name)


def nvidia_smi_gpus() -> list[GpuRow]:
    """Every card ``nvidia-smi`` lists, or none where it is missing or fails (a CPU machine)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    rows = [tuple(part.strip() for part in line.split(",", 2)) for line in out.stdout.splitlines() if line.strip()]
    return [row for row in rows if len(row) == 3]


def visible_gpus(rows: list[GpuRow], visible: str | None) -> list[dict]:
    """The cards of ``rows`` that ``CUDA_VISIBLE_DEVICES`` (``visible``; None: all) names, in its order: each entry
    an index or a UUID or its prefix, as CUDA reads it; entries naming no card are left out."""
    if visible is None:
        chosen = rows
    else:
        chosen = []
        for entry in (e.strip() for e in visible.split(",")):
            match = next((r for r in rows if entry and (entry == r[0] or r[1].startswith(entry))), None)
            if match is not None and match not in chosen:
                chosen.append(match)
    return [{"index": int(i) if i.isdigit() else i, "uuid": uuid, "name": name} for i, uuid, name in chosen]


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        model = None
    return model or platform.processor() or platform.machine()


def host_facts(env: Mapping[str, str] = os.environ,
               gpus: Callable[[], list[GpuRow]] = nvidia_smi_gpus) -> dict:
    """This machine: ``hostname``, ``cpu`` (model), ``cpus`` (logical CPUs) and ``gpus`` (``visible_gpus``)."""
    return {"hostname": socket.gethostname(), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "gpus": visible_gpus(gpus(), env.get("CUDA_VISIBLE_DEVICES"))}
