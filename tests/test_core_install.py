"""A core install (``pip install splitfuse``, no extras) simulates and plans: ``import sim``, a simulation and
``splitfuse simulate --help`` run with torch, transformers, FastAPI and the rest of the engine/server extras
unimportable, and ``splitfuse serve`` names the extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS_ONLY = ("torch", "transformers", "safetensors", "tokenizers", "triton", "fastapi", "starlette", "uvicorn",
               "pydantic", "prometheus_client")

BLOCK = f"""
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not in the core install)", name=name)
sys.meta_path.insert(0, Refuse())
"""


def run_core(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_the_blocker_blocks():
    r = run_core("import torch")
    assert r.returncode != 0 and "blocked" in r.stderr


def test_simulation_runs_on_a_core_install():
    r = run_core("""
        import sim
        from engine.policy import PolicyConfig
        from sim.cluster import ClusterConfig, simulate
        from sim.metrics import summarize
        from sim.workload import Workload
        result = simulate(Workload(num_requests=50, rate=2.0), ClusterConfig("builtin-llama-2-7b", replicas=2,
                          policy=PolicyConfig(max_num_batched_tokens=512)), seed=0)
        s = summarize(result)
        assert s["requests"] == 50 and s["throughput_rps"] > 0, s
        print("ok", s["requests"])
        print(sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "transformers", "fastapi"}))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["ok 50", "[]"]


def test_cli_on_a_core_install():
    r = run_core("""
        from splitfuse.cli import cli
        cli(["simulate", "--help"])
    """)
    assert r.returncode == 0, r.stderr
    assert "--max-num-batched-tokens" in r.stdout and "--goodput" in r.stdout
    r = run_core("""
        from splitfuse.cli import cli
        cli(["simulate", "--profile", "builtin-llama-2-7b", "-n", "30", "--rate", "2", "--report", "none"])
    """)
    assert r.returncode == 0, r.stderr
    assert "throughput" in r.stdout
    for command, extra in (("serve", "server"), ("generate", "engine"), ("validate", "server")):
        r = run_core(f"""
            from splitfuse.cli import main
            sys.argv = ["splitfuse", {command!r}, "tiny-llama"]
            main()
        """)
        assert r.returncode != 0 and f"pip install 'splitfuse[{extra}]'" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "missing: torch" in r.stderr


def test_profile_outside_the_core_names_its_extra():
    r = run_core("""
        from splitfuse.cli import main
        sys.argv = ["splitfuse", "profile", "--model", "tiny-llama", "--device", "cpu", "--out", "/dev/null"]
        main()
    """)
    assert r.returncode != 0 and "pip install 'splitfuse[engine]'" in r.stderr, r.stderr
