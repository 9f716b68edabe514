"""The validation CSV format: read and checked (errors name the file line), compared per cell and metric, and the
shipped example is what its generator writes."""

import numpy as np
import pandas as pd
import pytest

from calibration.validation_results import BOUNDS, compare, read_validation, with_bounds

HEADER = "source,scheduler,mix,load,ttft_p50,throughput_rps\n"


def write(tmp_path, text, name="grid-a.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_closed_loop_cells_without_a_load_are_matched_by_their_clients(tmp_path):
    """As ``splitfuse validate`` writes them: a closed-loop cell has clients and an empty load."""
    text = ("scheduler,token_budget,mix,arrivals,load,clients,source,ttft_p50\n"
            "splitfuse,768,long,closed,,4,sim,0.3\nsplitfuse,768,long,closed,,4,server,0.2\n"
            "splitfuse,768,long,closed,,8,server,0.5\nsplitfuse,768,long,poisson,0.5,0,sim,0.1\n")
    errors = compare(read_validation([write(tmp_path, text)]))
    assert list(errors["cell"]) == ["splitfuse / long / 4 clients"]
    assert errors["rel_error"].iloc[0] == pytest.approx(0.5)


def test_compare_gives_the_simulators_relative_error_per_cell_and_metric(tmp_path):
    path = write(tmp_path, HEADER + "sim,splitfuse,chat,0.5,0.11,4\nserver,splitfuse,chat,0.5,0.10,5\n"
                 "client,splitfuse,chat,0.5,0.12,5\nsim,splitfuse,chat,0.8,0.2,6\n")
    df = read_validation([path])
    assert set(df["grid"]) == {"grid-a"} and set(df["kind"]) == {"measured"}
    server = compare(df).set_index("metric")
    assert len(server) == 2  # the 0.8 cell has no server row
    assert server.loc["ttft_p50", "rel_error"] == pytest.approx(0.1)
    assert server.loc["throughput_rps", "rel_error"] == pytest.approx(-0.2)
    assert compare(df, "client").set_index("metric").loc["ttft_p50", "rel_error"] == pytest.approx(0.11 / 0.12 - 1)


@pytest.mark.parametrize("key, first, second, label", [("seed", 3, 4, "seed"),
                                                     ("token_budget", 2048, 768, "budget")])
def test_cells_that_differ_by_one_key_alone_are_named_with_it(tmp_path, key, first, second, label):
    """Two cells alike but for their workload seed (or token budget) take it into their names; the seed is left
    out where it does not tell cells apart."""
    other = "seed" if key == "token_budget" else "token_budget"
    text = (f"source,scheduler,mix,load,{key},{other},ttft_mean\n"
            f"sim,splitfuse,long,0.5,{first},9,0.11\nclient,splitfuse,long,0.5,{first},9,0.10\n"
            f"sim,splitfuse,long,0.5,{second},9,0.2\nclient,splitfuse,long,0.5,{second},9,0.25\n"
            f"sim,splitfuse,long,0.9,{first},9,0.3\nclient,splitfuse,long,0.9,{first},9,0.3\n")
    errors = compare(read_validation([write(tmp_path, text)]), "client").set_index("cell")
    assert list(errors.index) == [f"splitfuse / long / load 0.5 / {label} {first}",
                                  f"splitfuse / long / load 0.5 / {label} {second}", "splitfuse / long / load 0.9"]
    assert errors["rel_error"].tolist() == pytest.approx([0.1, -0.2, 0.0])


@pytest.mark.parametrize("text, message", [
    (HEADER + "sim,splitfuse,chat,0.5,0.1,4\n\nengine,splitfuse,chat,0.5,0.1,4\n", "line 4: source 'engine'"),
    (HEADER + "sim,splitfuse,chat,0.5,fast,4\n", "line 2: ttft_p50 = 'fast'"),
    (HEADER + "sim,splitfuse,chat,0.5,0.1,4\nsim,splitfuse,chat,0.5,0.2,4\n", "line 3: a second sim row"),
    ("source,scheduler,load,ttft_p50\nsim,splitfuse,0.5,0.1\n", "missing column.*mix"),
    ("source,scheduler,mix,load,latency\nsim,splitfuse,chat,0.5,0.1\n", "no metric columns"),
])
def test_malformed_files_are_named_with_their_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        read_validation([write(tmp_path, text)])


def test_the_shipped_example_is_labelled_and_reproducible(tmp_path):
    from sim import validation_example

    shipped = read_validation([validation_example.OUT])
    assert set(shipped["kind"]) == {"example"}
    assert shipped["note"].str.contains("kind=example, not a GPU measurement").all()
    assert set(shipped["source"]) == {"sim", "server", "client"}
    again = pd.read_csv(validation_example.write(tmp_path / "again.csv"))
    pd.testing.assert_frame_equal(again, pd.read_csv(validation_example.OUT))
    errors = compare(shipped)["rel_error"].dropna()
    assert len(errors) > 100 and np.isfinite(errors).all()


def test_the_server_is_judged_against_the_simulators_server_view_where_a_grid_has_one(tmp_path):
    """``sim-server`` rows predict the server (the client's prediction, ``sim``, judges the client); a cell without
    one, from before the simulator wrote it, falls back to ``sim``."""
    text = ("source,scheduler,mix,load,ttft_mean\n"
            "sim,splitfuse,long,0.5,0.110\nsim-server,splitfuse,long,0.5,0.100\n"
            "server,splitfuse,long,0.5,0.080\nclient,splitfuse,long,0.5,0.100\n"
            "sim,splitfuse,long,0.9,0.300\nserver,splitfuse,long,0.9,0.200\n")
    results = read_validation([write(tmp_path, text)])
    server = compare(results, "server").set_index("load").rel_error
    assert server.to_dict() == pytest.approx({0.5: 0.25, 0.9: 0.5})
    assert compare(results, "client").set_index("load").rel_error.to_dict() == pytest.approx({0.5: 0.1})
    with pytest.raises(ValueError, match="server or client"):
        compare(results, "sim-server")


def test_error_table_gives_each_cells_headline_errors_in_percent(tmp_path):
    from calibration.validation_summary import error_table

    text = ("source,scheduler,mix,load,ttft_mean,tpot_mean,throughput_rps\n"
            "sim,splitfuse,long,0.5,0.11,0.020,4\nclient,splitfuse,long,0.5,0.10,0.025,5\n")
    table = error_table(read_validation([write(tmp_path, text)]), "grid-a")
    assert list(table.columns) == ["req/s", "TTFT", "TPOT"]
    assert table.iloc[0].tolist() == pytest.approx([-20.0, 10.0, -20.0])


def test_variant_table_judges_each_pricing_over_every_grids_cells(tmp_path):
    """Two grids, each shipped and priced on a typical host: one row per pricing over both grids' cells, each cell
    judged on every bound; a pricing only one grid has is left out; a missing grid or view is named."""
    from calibration.validation_summary import variant_table

    header = "source,scheduler,mix,load,ttft_mean,tpot_mean,throughput_rps\n"
    measured = "client,splitfuse,long,0.5,0.100,0.0200,5\nclient,splitfuse,long,0.9,0.200,0.0300,9\n"

    def grid(name, tpots):  # the simulator's TPOT at loads 0.5 and 0.9; TTFT and throughput exact
        sims = "".join(f"sim,splitfuse,long,{load},{ttft},{tpot},{rate}\n"
                       for load, ttft, tpot, rate in ((0.5, 0.100, tpots[0], 5), (0.9, 0.200, tpots[1], 9)))
        return write(tmp_path, header + measured + sims, f"{name}.csv")

    paths = [grid("a", (0.0190, 0.0270)), grid("a-typical-host", (0.0198, 0.0297)),
             grid("b", (0.0200, 0.0285)), grid("b-typical-host", (0.0210, 0.0300)), grid("b-own-host", (0.02, 0.03))]
    table = variant_table(read_validation(paths), ["a", "b"]).set_index("pricing")
    assert list(table.index) == ["shipped", "typical-host"]
    assert table.loc["shipped", "cells in every bound"] == "1 of 4"  # TPOT -5, -10, 0, -5%: a 3% bound
    assert table.loc["typical-host", "cells in every bound"] == "3 of 4"  # b at 0.5 reads +5%
    assert table.loc["shipped", "mean |TPOT| %"] == pytest.approx((5 + 10 + 0 + 5) / 4)
    assert table.loc["typical-host", "TPOT %"] == "-1.0..+5.0"
    with pytest.raises(ValueError, match="no grid named c"):
        variant_table(read_validation(paths), ["a", "c"])
    with pytest.raises(ValueError, match="no server view"):
        variant_table(read_validation(paths), ["a", "b"], "server")


def test_validation_md_states_the_fastgen_headline_the_shipped_grid_gives():
    from calibration.validation_results import VALIDATION_DIR
    from calibration.validation_summary import fastgen_headline

    results = read_validation()
    headline = fastgen_headline(results[results.kind == "measured"]).set_index("source")
    text = (VALIDATION_DIR.parent / "VALIDATION.md").read_text()
    for source in ("client", "sim"):
        assert f"{headline.loc[source, 'effective throughput ratio']:.2f}x" in text, source
    assert f"**{headline.loc['client', 'p95 ITL ratio @32']:.2f}**" in text


def test_each_cell_is_judged_by_the_bounds_of_its_load_and_fleet():
    """Up to saturation each metric has its bound; past it (load > 1) every one is 10%; a fleet's cell is judged on
    throughput, mean TPOT and mean TTFT alone. A metric not measured (NaN) is not judged."""
    cells = pd.DataFrame([
        {"load": 0.9, "replicas": 1, **dict.fromkeys(BOUNDS, 0.0), "tpot_mean": -0.031, "ttft_p90": float("nan")},
        {"load": 0.9, "replicas": 1, **dict.fromkeys(BOUNDS, 0.0), "tpot_mean": 0.029, "ttft_mean": -0.049},
        {"load": 1.15, "replicas": 1, **dict.fromkeys(BOUNDS, 0.09), "ttft_mean": -0.11},
        {"load": 0.5, "replicas": 2, **dict.fromkeys(BOUNDS, 0.0), "e2e_p90": 0.5, "throughput_rps": 0.021},
        {"load": float("nan"), "replicas": 1, **dict.fromkeys(BOUNDS, 0.0), "e2e_mean": 0.04},
    ])
    judged = with_bounds(cells)
    assert judged.misses.tolist() == ["tpot_mean", "", "ttft_mean", "throughput_rps", "e2e_mean"]
    assert judged.in_bounds.tolist() == [False, True, False, False, False]

