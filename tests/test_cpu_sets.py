"""``sim.cpu_sets``: CPU lists in taskset's format, a machine's physical cores, and the server's cores apart from its
clients'."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.cpu_sets import affinity, format_cpu_list, parse_cpu_list, physical_cores, split_cores


def test_a_cpu_list_reads_ranges_and_single_cpus():
    assert parse_cpu_list("0-3,8") == {0, 1, 2, 3, 8}
    assert parse_cpu_list("5") == {5}
    assert format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"


@given(st.sets(st.integers(0, 200), min_size=1))
def test_a_formatted_list_reads_back_the_same_cpus(cpus):
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-", "-2", "1,,2"])
def test_a_bad_cpu_list_is_refused_by_name(text):
    with pytest.raises(ValueError, match="is not a CPU list"):
        parse_cpu_list(text)


def _sysfs(tmp_path, siblings: dict[int, str]):
    for cpu, text in siblings.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_hyperthreads_of_one_core_stay_together(tmp_path):
    sysfs = _sysfs(tmp_path, {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"})
    assert physical_cores(range(8), sysfs) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert physical_cores({0, 1, 4}, sysfs) == [(0, 4), (1,)]  # only the CPUs allowed
    assert physical_cores({0, 9}, sysfs) == [(0,), (9,)]  # no topology: a core of its own


def test_each_group_gets_its_own_cores_the_server_apart_from_its_clients():
    cores = [(i, i + 8) for i in range(8)]
    (s0, c0), (s1, c1) = split_cores(cores, 2)
    assert s0 == {0, 8, 1, 9} and c0 == {2, 10, 3, 11} and s1 == {4, 12, 5, 13} and c1 == {6, 14, 7, 15}
    ((server, client),) = split_cores([(0,), (1,), (2,)], 1, server_share=0.9)
    assert server == {0, 1} and client == {2}  # the clients keep a core


def test_too_few_cores_are_refused():
    with pytest.raises(ValueError, match="cannot give 2 measurement"):
        split_cores([(0,), (1,), (2,)], 2)
    with pytest.raises(ValueError, match="server_share"):
        split_cores([(0,), (1,)], 1, server_share=1.0)


def test_affinity_holds_for_the_block_and_is_given_back():
    own = os.sched_getaffinity(0)
    one = {min(own)}
    with affinity(one):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == own
    with affinity(None):
        assert os.sched_getaffinity(0) == own
