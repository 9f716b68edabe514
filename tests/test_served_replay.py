"""``benchmarks.served_replay_gpu --passes``: the file of passes to replay is read and checked before any GPU work."""

import json

import pytest

from benchmarks.served_replay_gpu import read_passes


def test_traced_and_made_up_passes_are_read_in_order(tmp_path):
    traced = {"path": "mixed-graph", "decode_contexts": [900, 1100], "chunks": [[1024, 510, 600]], "device_s": 0.016}
    made_up = {"label": "grid 512", "decode_contexts": [], "chunks": [[0, 512, 1000]]}
    path = tmp_path / "passes.jsonl"
    path.write_text(json.dumps(traced) + "\n\n" + json.dumps(made_up) + "\n")
    assert read_passes(path) == [traced, made_up]


@pytest.mark.parametrize("bad, named", [({"label": "grid", "decode_contexts": [5]}, "chunks"),
                                        ({"decode_contexts": [5], "chunks": [[0, 8, 0]]}, "label")])
def test_a_pass_without_its_shape_or_a_name_is_refused_by_line(tmp_path, bad, named):
    path = tmp_path / "passes.jsonl"
    good = {"label": "grid", "decode_contexts": [], "chunks": [[0, 8, 0]]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SystemExit, match=rf"line 2: .*missing {named}"):
        read_passes(path)
