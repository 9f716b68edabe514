"""Every number in a profile is checked when it loads: a damaged file fails naming the field, never a NaN run."""

import json
import math

import pytest
from click.testing import CliRunner

from calibration.profile import load_profile, resolve
from sim.cli import simulate as simulate_cli

SHIPPED = json.loads(resolve("llama-2-7b").read_text())


def damaged(tmp_path, mutate) -> str:
    d = json.loads(json.dumps(SHIPPED))
    mutate(d)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(d))  # json writes NaN and Infinity as such, as a careless tool would
    return str(path)


def set_knot(d, value):
    d["cost_model"]["graph"]["knots"][3] = value


@pytest.mark.parametrize("mutate, message", [
    (lambda d: set_knot(d, math.nan), r"cost_model\.graph\.knots\[3\] is nan"),
    (lambda d: d["cost_model"]["eager"]["coef"].update(tokens=math.inf), r"cost_model\.eager\.coef\.tokens is inf"),
    (lambda d: d["noise"].__setitem__(0, math.nan), r"noise\[0\] is nan"),
    (lambda d: set_knot(d, 500.0), "strictly increasing"),
    (lambda d: d["cost_model"]["graph"]["knots"].__setitem__(0, -2.0), "positive token counts"),
    (lambda d: d["cost_model"]["eager"]["coef"].update(decode_context=-1e-6), "decode_context is -1e-06.*>= 0"),
    (lambda d: d["cost_model"]["graph"].update(floor={"floor": -0.1, "floor_seqs": 0.0, "floor_tokens": 0.0}),
     r"graph\.floor\.floor is -0\.1"),  # whether or not the shipped fit chose a floor
    (lambda d: d["cost_model"]["graph"]["coef"].update(intercept=-1.0), r"intercept is -1\.0.*>= 0"),
    (lambda d: d["cost_model"].update(eager={**d["cost_model"]["eager"], "floor": None,
                                             "coef": {**d["cost_model"]["eager"]["coef"], "num_seqs": -1.0}}),
     "predicts -.* s for a pass of 4096 tokens"),
    (lambda d: d["cost_model"].update(graph_max_batch=-1), "graph_max_batch must be >= 0"),
    (lambda d: d["points"]["rows"][0].__setitem__(d["points"]["columns"].index("wall_s"), 0.0), "wall_s must be"),
    (lambda d: d["cost_model"].update(mixed_buckets=[64, 32]), "strictly increasing"),
])
def test_a_damaged_number_is_named(tmp_path, mutate, message):
    with pytest.raises(ValueError, match=message):
        load_profile(damaged(tmp_path, mutate))


def test_a_nan_knot_stops_the_simulator_with_the_field(tmp_path):
    """Before, a NaN knot loaded and ``splitfuse simulate`` exited 0 with NaN results."""
    path = damaged(tmp_path, lambda d: set_knot(d, math.nan))
    result = CliRunner().invoke(simulate_cli, ["--profile", path, "-n", "20"])
    assert result.exit_code == 2 and "knots[3] is nan" in result.output and "Traceback" not in result.output


def test_every_shipped_profile_passes_the_checks():
    from calibration.profile import shipped_profiles

    assert all(load_profile(name).num_kv_blocks > 0 for name in shipped_profiles())


@pytest.mark.parametrize("name", ["llama-2-7b-h200", "llama-2-7b-h100", "llama-2-13b-h200", "llama-3-8b-h200",
                                  "mistral-7b-h200"])
def test_a_shipped_profile_is_what_its_points_fit_to(tmp_path, name):
    """``splitfuse profile --refit`` gives the shipped file back: its model, split and held-out figures come from
    its points under this code, and its serving and energy sections are kept."""
    from calibration.cli import profile as profile_cmd

    shipped = resolve(name)
    out = tmp_path / "refit.json"
    result = CliRunner().invoke(profile_cmd, ["--refit", str(shipped), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text()) == json.loads(shipped.read_text())
    result = CliRunner().invoke(profile_cmd, ["--refit", str(shipped), "--model", "tiny-llama", "--out", str(out)])
    assert result.exit_code == 2 and "--refit takes only a profile" in result.output


def test_a_profile_without_points_cannot_be_refitted(tmp_path):
    from calibration.cli import profile as profile_cmd

    d = json.loads(json.dumps(SHIPPED))
    d.pop("points")
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(d))
    result = CliRunner().invoke(profile_cmd, ["--refit", str(path), "--out", str(tmp_path / "out.json")])
    assert result.exit_code == 1 and "holds 0 points: nothing to refit" in result.output
    assert not (tmp_path / "out.json").exists()
