"""Sample the CPU time of every Python process and each of its threads, once a second, into a CSV (gzip), to see
which process of a validation run (engine, API, router, clients) is busy and whether the clients keep up:
``python -m calibration.cpu_load OUT.csv.gz [SECONDS]``; stop it with a signal. Columns: ``t`` (seconds since the
epoch), ``pid``, ``ppid``, ``tid``, ``cmd`` (the command line's start), ``user_s`` and ``system_s``
(cumulative), ``cpu`` (the CPU the thread last ran on, the process's for its threads)."""

from __future__ import annotations

import csv
import gzip
import signal
import sys
import time

import psutil

COLUMNS = ["t", "pid", "ppid", "tid", "cmd", "user_s", "system_s", "cpu"]


def sample(writer, name: str = "python") -> None:
    """One row per thread of each process whose name starts with ``name``."""
    now = time.time()
    for p in psutil.process_iter(["pid", "ppid", "name", "cmdline", "cpu_num"]):
        info = p.info
        if not (info["name"] or "").startswith(name):
            continue
        cmd = " ".join(info["cmdline"] or [])[:120]
        try:
            threads = p.threads()
        except psutil.Error:
            continue
        for t in threads:
            writer.writerow([f"{now:.3f}", info["pid"], info["ppid"], t.id, cmd, f"{t.user_time:.3f}",
                             f"{t.system_time:.3f}", info["cpu_num"]])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        raise SystemExit("usage: python -m calibration.cpu_load OUT.csv.gz [SECONDS]")
    try:
        every = float(args[1]) if len(args) > 1 else 1.0
    except ValueError:
        every = float("nan")
    if not every > 0:
        raise SystemExit(f"SECONDS must be a positive number, got {args[1]!r}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # close the file whole
    with gzip.open(args[0], "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        while True:
            sample(writer)
            time.sleep(every)


if __name__ == "__main__":
    main()
