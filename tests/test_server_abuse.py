"""A small run of ``benchmarks/server_abuse.py`` (the 100 ms target is the benchmark's; here the server must
merely not freeze, as it did when a 10 MB prompt was parsed and tokenized on its event loop for 8 s): idle and
slow connections and big prompts while normal streams run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_idle_slow_connections_and_big_prompts_do_not_freeze_the_server(tmp_path):
    out = tmp_path / "abuse.json"
    cmd = [sys.executable, "-m", "benchmarks.server_abuse", "--idle", "30", "--slow", "30", "--streams", "10",
           "--max-tokens", "16", "--big-mb", "10", "--min-seconds", "7", "--out", str(out)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["streams_completed"] == 10
    assert result["big_prompts_answered"] >= 1 and result["big_prompt_statuses"] == [400]
    assert result["health_probes"] > 10 and result["health_max_ms"] < 1000
    assert result["connections_closed_by_server"] >= 60  # every idle and slow one, after --timeout-keep-alive
