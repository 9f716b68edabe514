"""CPU sets for a measurement: the server on CPUs of its own, its clients on others, whole physical cores apart.

A validation's clients run on the machine they measure. Left to the OS they share cores (and a core's hyperthreads)
with the server, whose host work between passes they can slow (``calibration/VALIDATION.md``, forty-eighth round);
a server's clients are elsewhere in production. Lists use ``taskset``'s format ("0-3,8")."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SYSFS_CPUS = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a list such as "0-3,8" (``taskset -c``'s format)."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or (dash and int(last) < int(first)):
            raise ValueError(f"{text!r} is not a CPU list such as 0-3,8 ({part!r})")
        cpus.update(range(int(first), int(last if dash else first) + 1))
    return frozenset(cpus)


def format_cpu_list(cpus) -> str:
    """``cpus`` as a list such as "0-3,8"."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def physical_cores(allowed=None, sysfs: Path = SYSFS_CPUS) -> list[tuple[int, ...]]:
    """The logical CPUs of each physical core (hyperthreads of one core together) among ``allowed`` (default: the
    CPUs this process may run on), in the order of their first CPU. A CPU whose siblings sysfs does not tell is a
    core of its own."""
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    cores: dict[tuple[int, ...], None] = {}
    for cpu in sorted(allowed):
        try:
            siblings = parse_cpu_list((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            siblings = frozenset({cpu})
        cores[tuple(sorted(siblings & allowed | {cpu}))] = None
    return sorted(cores, key=min)


def split_cores(cores: list[tuple[int, ...]], groups: int, server_share: float = 0.5
                ) -> list[tuple[frozenset[int], frozenset[int]]]:
    """(server CPUs, client CPUs) for each of ``groups`` measurements that run side by side: each its own equal run
    of ``cores``, of which the server takes ``server_share`` (at least one core) and the clients the rest (at least
    one). Raises ValueError where there are fewer than two cores a group."""
    if groups < 1:
        raise ValueError(f"groups must be at least 1, got {groups}")
    if not 0 < server_share < 1:
        raise ValueError(f"server_share must lie between 0 and 1, got {server_share}")
    per_group = len(cores) // groups
    if per_group < 2:
        raise ValueError(f"{len(cores)} physical cores cannot give {groups} measurement(s) two cores each "
                         "(one for the server, one for its clients)")
    server = min(per_group - 1, max(1, round(per_group * server_share)))
    out = []
    for g in range(groups):
        mine = cores[g * per_group:(g + 1) * per_group]
        out.append((frozenset(c for core in mine[:server] for c in core),
                    frozenset(c for core in mine[server:] for c in core)))
    return out


@contextlib.contextmanager
def affinity(cpus):
    """Run this process (and what it starts meanwhile) on ``cpus`` for the ``with`` block; None: leave it as it is."""
    if not cpus:
        yield
        return
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


def main(argv: list[str] | None = None) -> None:
    """``python -m sim.cpu_sets GROUPS``: one line per group, "SERVER_CPUS CLIENT_CPUS"."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        raise SystemExit("usage: python -m sim.cpu_sets GROUPS")
    for server, client in split_cores(physical_cores(), int(args[0])):
        print(format_cpu_list(server), format_cpu_list(client))


if __name__ == "__main__":
    main()
