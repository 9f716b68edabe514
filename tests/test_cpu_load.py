"""``calibration.cpu_load``: a row per thread of each Python process, with its cumulative CPU time."""

import csv
import io
import os

import pytest

psutil = pytest.importorskip("psutil")

from calibration.cpu_load import COLUMNS, main, sample  # noqa: E402


def test_a_sample_holds_each_thread_of_this_process():
    out = io.StringIO()
    sample(csv.writer(out), name=psutil.Process().name())
    rows = [dict(zip(COLUMNS, row)) for row in csv.reader(io.StringIO(out.getvalue()))]
    mine = [r for r in rows if int(r["pid"]) == os.getpid()]
    assert {int(r["tid"]) for r in mine} == {t.id for t in psutil.Process().threads()}
    assert all(float(r["user_s"]) >= 0 and float(r["system_s"]) >= 0 and int(r["ppid"]) == os.getppid() for r in mine)


def test_bad_arguments_name_the_usage():
    with pytest.raises(SystemExit, match="usage"):
        main([])
    for seconds in ("x", "0", "-1"):
        with pytest.raises(SystemExit, match="SECONDS must be a positive number"):
            main(["out.csv.gz", seconds])
