"""``splitfuse validate`` end to end on the CPU: the tiny model behind its real server (an engine process with a
pass trace), the bench client in two processes, and the simulator on a profile swept from that engine."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from calibration import plans  # noqa: E402
from calibration.cli import fit_points_file  # noqa: E402
from calibration.profile import VERSION, load_profile  # noqa: E402
from calibration.serving import NOISE_QUANTILES, PATHS, fit_path_levels, scale_path  # noqa: E402
from calibration.sweep import run_sweep  # noqa: E402
from engine.config import SAMPLER_DRAW  # noqa: E402
from engine.policy import PassFeatures, PolicyConfig, make_balancer, plan_features  # noqa: E402
from sim.costs import ConstantCost, mean_noise_factor  # noqa: E402
from sim.loop_phases import MAX_LOOP_S, loop_rows, phase_table  # noqa: E402
from sim.loop_phases import main as loop_phases_main  # noqa: E402
from sim.validate import (  # noqa: E402
    OVERLOAD_DECODE_MAX_SEQS,
    STEADY_COMPLETIONS,
    Cell,
    Measured,
    Server,
    cell_passes,
    cell_prompts,
    decode_steps_as_mixed,
    engine_costs,
    fill_decode_max_context,
    greedy_ratios,
    load_measured,
    make_cells,
    overload_path_factors,
    overload_requests,
    parse_mix,
    read_traces,
    router_hop,
    run_host,
    serving_measurements,
    simulated_overload_rps,
    steady_throughput,
    trace_files,
    validate,
    with_loop,
    with_path_levels,
)

MIX = "tiny=uniform:8:40/fixed:5"
SPECS = [plans.PassSpec("prefill", chunks=((0, n, 0),)) for n in (3, 9, 17, 25, 40, 64, 100, 130)]
SPECS += [plans.PassSpec("decode", decode_contexts=(c,) * b) for b, c in ((1, 20), (2, 33), (3, 12), (4, 40),
                                                                           (6, 30), (8, 17), (2, 60), (5, 25))]
SPECS += [plans.PassSpec("mixed", decode_contexts=(30,) * b, chunks=((0, n, 0),)) for b, n in ((1, 8), (2, 20),
                                                                                              (3, 33), (4, 14))]
# passes of several prompts, as the cells run them: without them the fit may extrapolate to negative times there
SPECS += [plans.PassSpec("prefill", chunks=tuple((0, n, 0) for n in ns)) for ns in ((10, 30), (25, 8, 17), (40, 36))]
SPECS += [plans.PassSpec("mixed", decode_contexts=(20,) * b, chunks=((0, 12, 0), (0, 20, 0))) for b in (1, 3)]
# and the overload run's, which fill the 768-token budget with tens of prompts, decodes beside them, and a prompt of
# the whole context, which loading the profile prices (``calibration.profile``)
SPECS += [plans.PassSpec("prefill", chunks=((0, n, 0),)) for n in (300, 600, 1000)]
SPECS += [plans.PassSpec("prefill", chunks=((0, 24, 0),) * k) for k in (10, 20, 32)]
SPECS += [plans.PassSpec("mixed", decode_contexts=(30,) * b, chunks=((0, 26, 0),) * k) for b, k in ((10, 10), (21, 20),
                                                                                                  (24, 28))]


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    """A profile of the tiny model on this CPU, from a small sweep."""
    path = tmp_path_factory.mktemp("profile")
    run_sweep("tiny-llama", "fp32", path / "p.points.jsonl", device="cpu", progress=False, specs=SPECS)
    fit_points_file(path / "p.points.jsonl", path / "p.json")
    return path / "p.json"


@pytest.fixture(scope="module")
def run(cpu_profile, tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    args = ["tiny-llama", "--profile", str(cpu_profile), "--device", "cpu", "--num-kv-blocks", "256", "--mix", MIX,
            "--loads", "0.5", "--clients", "2", "-n", "10", "--warmup", "28", "--client-processes", "2",
            "--out", str(out), "--fit-serving", str(out / "served.json")]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_every_cell_has_all_four_views(run):
    out, output = run
    frame = pd.read_csv(out / "validation.csv")
    assert len(frame) == 2 * 4 and set(frame.source) == {"sim", "sim-server", "server", "client"}
    assert (frame.requests == 10).all() and set(frame.arrivals) == {"poisson", "closed"}
    for column in ("ttft_mean", "tpot_mean", "e2e_p90", "throughput_rps", "mean_tokens_per_pass"):
        assert np.isfinite(frame[column]).all() and (frame[column] > 0).all(), column
    errors = pd.read_csv(out / "errors.csv")
    assert len(errors) == 2 * 2 and set(errors.view) == {"server", "client"}
    assert "measured saturation" in output and (out / "report.html").read_text().count("plotly") > 10


def test_the_simulators_server_view_is_its_run_before_delivery(run):
    """``sim-server`` is the simulated run with each token at its pass's end: the same requests and arrivals, every
    token a delivery (> 0 in the fitted profile) earlier, so first tokens and finishes come earlier by it."""
    out, _ = run
    frame = pd.read_csv(out / "validation.csv")
    sim, server = (frame[frame.source == s].set_index("arrivals") for s in ("sim", "sim-server"))
    assert (sim.requests == server.requests).all()
    assert (server.ttft_mean < sim.ttft_mean).all() and (server.e2e_mean < sim.e2e_mean).all()
    assert ((sim.ttft_mean - server.ttft_mean) < 0.5).all()  # a delivery, not a pass's worth of seconds
    errors = pd.read_csv(out / "errors.csv").set_index(["view", "arrivals"])
    measured = frame[frame.source == "server"].set_index("arrivals")
    assert np.allclose(errors.loc["server"].ttft_mean, server.ttft_mean / measured.ttft_mean - 1)


def test_the_run_records_the_machine_it_measured_on(run):
    out, _ = run
    host = json.loads((out / "meta.json").read_text())["host"]
    assert host["hostname"] and host["cpus"] >= 1 and isinstance(host["gpus"], list)


def test_the_client_sees_each_token_after_the_pass_that_made_it(run):
    out, _ = run
    delivery = pd.read_csv(out / "delivery.csv")
    assert len(delivery) == 20
    assert (delivery.client_first_token >= delivery.server_first_token).all()
    assert (delivery.client_finish >= delivery.server_finish).all()
    assert (delivery.client_first_token - delivery.server_first_token).median() < 0.5  # seconds, on one host


def test_passes_are_traced_with_predictions(run, cpu_profile):
    out, _ = run
    passes = pd.read_csv(out / "passes.csv")
    assert len(passes) > 10 and set(passes.path) == {"eager"}  # no CUDA graphs on the CPU
    assert (passes.pass_s > 0).all() and (passes.predicted_s > 0).all()
    busy = passes.dropna(subset=["loop_s"])
    assert len(busy) and (busy.loop_s >= busy.pass_s).all() and (busy.serving_s > 0).all()
    # every token of the 20 measured requests (5 each) came from a traced pass's sampled entries
    assert passes.num_samples.sum() >= 20 * 5
    # each pass's swept price of its prompt attention (what a serving attention scale grows): 0 without prompts
    profile = load_profile(str(cpu_profile))
    features = [PassFeatures(**{k: row[k] for k in PassFeatures._fields}) for _, row in passes.iterrows()]
    assert passes.attention_s.tolist() == pytest.approx([profile.attention_seconds(f) for f in features])
    assert (passes[passes.prefill_tokens == 0].attention_s == 0).all()


def test_each_traced_pass_has_the_shape_that_runs_it_again(run):
    """The trace keeps each pass's decode contexts and chunks: the sweep's ``PassSpec`` of that shape has the
    traced pass's features (``benchmarks.served_replay_gpu`` runs served passes again from them)."""
    out, _ = run
    passes, _ = read_traces(trace_files(out, "splitfuse-768", 1))
    assert len(passes[0]) > 10
    for p in passes[0]:
        spec = plans.PassSpec("served", tuple(p["decode_contexts"]), tuple(map(tuple, p["chunks"])))
        assert plan_features(spec) == PassFeatures.from_mapping(p), p
        assert p["device_s"] is None  # no device clock on the CPU


def test_an_older_traces_passes_get_their_longest_decode_context_from_the_requests():
    """A pass that made token k >= 1 of a request decoded over prompt + k tokens; a pass some of whose decodes are
    not among the known requests stays unknown (0), and a recorded value is kept."""
    passes = [[{"end": 1.0, "decode_tokens": 0}, {"end": 2.0, "decode_tokens": 2}, {"end": 3.0, "decode_tokens": 2},
               {"end": 4.0, "decode_tokens": 1, "decode_max_context": 7}]]
    requests = {"a": {"token_times": [1.0, 2.0, 3.0]}, "b": {"token_times": [1.0, 2.0]},
                "c": {"token_times": [2.5, 3.0]}}
    fill_decode_max_context(passes, requests, {"a": 100, "b": 40})
    assert [p["decode_max_context"] for p in passes[0]] == [0, 101, 0, 7]


def test_a_pass_that_samples_nothing_is_timed_with_the_next_that_does():
    """Prompt chunks alone end without waiting for the GPU: their work shows in the next pass that samples, which
    is compared with the prediction of them all, from the first one's start."""

    class Cost:
        def predict(self, f):
            return 0.010

    def traced(start, samples, updated):
        return {"start": start, "sent": updated + 1e-5, "updated": updated, "path": "mixed-graph", "ahead": False,
                "num_outputs": samples, **dict.fromkeys(PassFeatures._fields, 1), "num_samples": samples}

    trace = [traced(0.000, 0, 0.001), traced(0.0012, 0, 0.002), traced(0.0022, 1, 0.030), traced(0.0302, 1, 0.040),
             traced(0.0403, 1, 0.050)]
    cell = Cell("splitfuse", 768, "tiny", "fixed:8", "fixed:2", 1)
    rows = cell_passes(Measured(cell, None, [], 0.0, (0.0, 1.0)), [trace], Cost())
    assert [r["passes"] for r in rows] == [0, 0, 3, 1, 1]
    merged = rows[2]
    assert merged["predicted_s"] == pytest.approx(0.030) and merged["pass_s"] == pytest.approx(0.030)
    assert merged["loop_s"] == pytest.approx(0.0302)
    assert np.isnan(rows[0]["predicted_s"]) and np.isnan(rows[0]["loop_s"]) and rows[0]["serving_s"] > 0
    assert rows[3]["predicted_s"] == pytest.approx(0.010) and rows[3]["pass_s"] == pytest.approx(0.0098)
    assert np.isnan(rows[4]["loop_s"])  # the last pass: no next step to time it to


def test_each_pass_row_carries_its_own_phases():
    """``passes.csv`` splits each traced pass into its phases (plan, inputs and enqueue, waiting for the sampled
    ids, the scheduler's update) and the GPU's own time, NaN where the trace has no such marks."""

    class Cost:
        def predict(self, f):
            return 0.010

    marks = {"start": 0.0, "scheduled": 0.0001, "launched": 0.0011, "sampled": 0.0091, "updated": 0.0093,
             "sent": 0.0094, "device_s": 0.0075}
    traced = {**marks, "path": "decode-graph", "ahead": False, "num_outputs": 1,
              **dict.fromkeys(PassFeatures._fields, 1)}
    bare = {k: v for k, v in traced.items() if k not in ("scheduled", "launched", "sampled", "device_s")}
    cell = Cell("splitfuse", 768, "tiny", "fixed:8", "fixed:2", 1)
    timed, untimed = cell_passes(Measured(cell, None, [], 0.0, (0.0, 1.0)),
                                 [[traced, {**bare, "start": 0.0095, "updated": 0.02, "sent": 0.021}]], Cost())
    assert timed["schedule_s"] == pytest.approx(0.0001) and timed["prepare_s"] == pytest.approx(0.001)
    assert timed["wait_s"] == pytest.approx(0.008) and timed["update_s"] == pytest.approx(0.0002)
    assert timed["device_s"] == pytest.approx(0.0075)
    assert all(np.isnan(untimed[k]) for k in ("schedule_s", "prepare_s", "wait_s", "update_s", "device_s"))


def test_a_greedy_cell_s_passes_are_priced_as_greedy_ones():
    """In a cell sent at temperature 0 each pass is compared with the cost's greedy price of it, enqueued ahead or
    not (what the simulator charges); a sampled cell's with the plain price."""

    class Cost:
        def predict(self, f):
            return 0.010

        def greedy_seconds(self, f, kind, price):
            return {"step": 0.8, "ahead": 0.6}[kind] * price if f.num_samples else None

    def traced(start, updated, ahead):
        return {"start": start, "sent": updated + 1e-5, "updated": updated, "path": "decode-graph", "ahead": ahead,
                "num_outputs": 1, **dict.fromkeys(PassFeatures._fields, 1)}

    trace = [traced(0.0, 0.008, False), traced(0.0082, 0.014, True), traced(0.0142, 0.022, False)]
    greedy = Cell("splitfuse", 768, "tiny", "fixed:8", "fixed:2", 1, temperature=0.0)
    sampled = Cell("splitfuse", 768, "tiny", "fixed:8", "fixed:2", 1)
    rows = cell_passes(Measured(greedy, None, [], 0.0, (0.0, 1.0)), [trace], Cost())
    assert [r["predicted_s"] for r in rows] == pytest.approx([0.008, 0.006, 0.008])
    rows = cell_passes(Measured(sampled, None, [], 0.0, (0.0, 1.0)), [trace], Cost())
    assert [r["predicted_s"] for r in rows] == pytest.approx([0.010] * 3)


def test_fit_serving_writes_a_profile_that_charges_the_serving_path(run, cpu_profile):
    """Fitted on the warm-up and overload runs: the served step per path, the loop's work, admission, delivery."""
    out, output = run
    served = load_profile(out / "served.json")
    assert json.loads((out / "served.json").read_text())["version"] == VERSION
    s = served.serving
    assert s is not None and "serving: loop" in output
    assert s.fit["loop"]["n"] >= 10 and s.fit["admission"]["n"] >= 10 and s.fit["delivery"]["n"] >= 10
    assert s.fit["admission"]["source"] == "light load"  # 16 warm-up clients, 12 requests after their first
    u = np.linspace(0, 0.999, 50)
    admission = s.admission_seconds(np.full(50, 30), u)
    # Seconds, on a CPU the overload floods (and that other jobs may share): bounds loose enough for a loaded
    # machine that still catch a unit slip (milliseconds read as seconds would be thousands).
    assert (0 < admission).all() and np.median(admission) < 10
    assert 0 < s.delivery_seconds(8) < 5
    assert "eager" in s.fit["path_scale"] and 0.2 < s.path_scale["eager"] < 5
    f = PassFeatures(8, 0, 8, 8, 0, 8 * 30, 0, 8)
    base = load_profile(cpu_profile)
    assert served.predict(f) == pytest.approx(s.path_scale["eager"] * base.predict(f) + s.loop_seconds(8))
    prompts = np.full(50, 100)
    assert (served.admission_seconds(prompts, u) == s.admission_seconds(prompts, u)).all()
    assert not base.admission_seconds(prompts, u).any() and base.delivery_seconds(8) == 0


def test_each_client_process_first_request_stays_out_of_the_admission_fit(run, cpu_profile):
    # two client processes: rows 0 and 1 were each process's first (before warm_up, they paid its start-up)
    out, _ = run
    _, requests = serving_measurements(out, load_profile(cpu_profile))
    _, runs, _ = load_measured(out, "calibration")
    overload = [m for _, m, _ in runs if not m.cell.clients]
    flood = [r for r in requests if not r["light"]]
    assert overload and min(r["id"] for r in flood) == 2
    assert len(flood) == 2 * sum(len(m.records) - 2 for m in overload)  # a first and a last token each
    # the warm-up's closed-loop clients: each one's first request (sent together at the start) stays out too
    warmup = [m for _, m, _ in runs if m.cell.clients]
    light = [r for r in requests if r["light"]]
    assert warmup and len(light) == sum(len(m.records) - m.cell.clients for m in warmup)
    assert min(r["id"] for r in light) == warmup[0].cell.clients


@pytest.mark.parametrize("mix, loads, clients, message", [
    ("huge", [0.5], [], "choose from"), ("x=uniform:8/fixed:5", [0.5], [], "uniform takes 2"),
    ("long", [], [], "--loads"),
])
def test_bad_grids_are_refused_with_the_flag_named(mix, loads, clients, message):
    with pytest.raises(ValueError, match=message):
        make_cells([("splitfuse", 768)], [mix], loads, clients, 10, 0)
    assert parse_mix("long")[0] == "long"


def test_open_loop_cells_run_at_each_cap_on_requests_in_flight():
    from calibration.validation_results import cell_name

    cells = make_cells([("splitfuse", 768)], ["long"], [0.5], [4], 10, 0, caps=[0, 16])
    assert [(c.load, c.clients, c.max_concurrency) for c in cells] == [(0.5, 0, 0), (0.5, 0, 16), (None, 4, 0)]
    assert [c.workload(1.0).max_concurrency for c in cells[:2]] == [None, 16]
    assert cell_name(cells[1].keys()) == "splitfuse / long / load 0.5 / max concurrency 16"
    with pytest.raises(ValueError, match="--max-concurrency"):
        make_cells([("splitfuse", 768)], ["long"], [0.5], [], 10, 0, caps=[-1])


def test_cells_carry_the_requests_temperature():
    from calibration.validation_results import cell_name

    greedy = make_cells([("splitfuse", 768)], ["long"], [0.5], [4], 10, 0, temperature=0.0)
    assert [c.temperature for c in greedy] == [0.0, 0.0] and greedy[0].keys()["temperature"] == 0.0
    assert cell_name(greedy[0].keys()) == "splitfuse / long / load 0.5 / temperature 0"
    sampled = make_cells([("splitfuse", 768)], ["long"], [0.5], [], 10, 0)[0]
    assert sampled.temperature == 1.0 and cell_name(sampled.keys()) == "splitfuse / long / load 0.5"
    # the overload and warm-up runs are the cell's, changed: they keep its temperature
    assert dataclasses.replace(greedy[0], load=None, num_requests=64).temperature == 0.0
    with pytest.raises(ValueError, match="--temperature"):
        make_cells([("splitfuse", 768)], ["long"], [0.5], [], 10, 0, temperature=float("nan"))


def test_an_earlier_run_compares_again_without_measuring(run, cpu_profile, tmp_path):
    """``--from DIR`` re-simulates the stored measurements: on the profile the measuring run compared with it
    reproduces that run's simulated rows exactly (simulations are deterministic for a seed); on the swept profile
    without the serving section they change, the measured rows never."""
    out, _ = run
    original = pd.read_csv(out / "validation.csv")
    measured = ["server", "client"]
    for profile, same in ((out / "served.json", True), (cpu_profile, False)):
        again = tmp_path / profile.stem
        result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(profile), "--out", str(again)])
        assert result.exit_code == 0, result.output
        frame = pd.read_csv(again / "validation.csv")
        pd.testing.assert_frame_equal(original[original.source.isin(measured)].reset_index(drop=True),
                                      frame[frame.source.isin(measured)].reset_index(drop=True))
        sim_then, sim_now = original[original.source == "sim"], frame[frame.source == "sim"]
        assert np.allclose(sim_then.tpot_mean, sim_now.tpot_mean, rtol=0, atol=0) == same
        errors = pd.read_csv(again / "errors.csv")
        counts = ", ".join(f"{view} {int(part.in_bounds.sum())} of {len(part)}"
                           for view, part in errors.groupby("view", sort=False))
        assert f"cells within the bounds (errors.csv: in_bounds, misses): {counts}" in result.output
    result = CliRunner().invoke(validate, ["--profile", str(cpu_profile), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--from" in result.output


def test_a_pinned_server_runs_its_engine_on_those_cpus(tmp_path):
    """``Server(cpus=...)``: the API process and the engine process it spawns run on those CPUs alone, and the
    server's info (which every measured run keeps) says so."""
    psutil = pytest.importorskip("psutil")
    cpu = max(os.sched_getaffinity(0))
    with Server("tiny-llama", PolicyConfig(), {"device": "cpu", "num_kv_blocks": 16}, None, tmp_path / "server.log",
                cpus=frozenset({cpu})) as server:
        assert server.info["cpus"] == str(cpu)
        processes = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
        assert len(processes) >= 2 and all(p.cpu_affinity() == [cpu] for p in processes)


@pytest.mark.parametrize("flags, message", [
    (["--server-cpus", "100000"], "--server-cpus 100000: CPUs 100000 are not among this machine's"),
    (["--client-cpus", "0-x"], "is not a CPU list"),
])
def test_cpu_lists_are_checked_before_measuring(flags, message, tmp_path):
    result = CliRunner().invoke(validate, ["tiny-llama", "--profile", "llama-2-7b-h200-bf16", "--mix", "long",
                                           "--loads", "0.5", "--out", str(tmp_path), *flags])
    assert result.exit_code == 2 and message in result.output and not list(tmp_path.iterdir())


def test_cpu_lists_are_refused_when_comparing_an_earlier_run(run, tmp_path):
    out, _ = run
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"),
                                           "--server-cpus", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "are for measuring" in result.output


def test_a_host_margin_compares_on_a_slower_host(run, tmp_path):
    """``--host-margin`` stretches every simulated pass: the simulated latencies grow, the measured rows stay."""
    out, _ = run
    original = pd.read_csv(out / "validation.csv")
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "slow"), "--host-margin", "0.5"])
    assert result.exit_code == 0, result.output
    slow = pd.read_csv(tmp_path / "slow" / "validation.csv")
    tpot = {source: (slow[slow.source == source].tpot_mean.values, original[original.source == source].tpot_mean.values)
            for source in ("server", "client", "sim")}
    assert all((tpot[source][0] == tpot[source][1]).all() for source in ("server", "client"))
    assert (tpot["sim"][0] > tpot["sim"][1]).all()
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "bad"), "--host-margin", "1.5"])
    assert result.exit_code == 2 and "--host-margin" in result.output


def test_a_run_compares_on_the_typical_host_of_the_others(run, tmp_path):
    """``--host-typical`` prices each cell's passes at the typical factor the profile's recorded hosts show for its
    mix and scheduler, the run's own host left out: with no other host the profile's price stands; labelled as
    another host, the run's recorded factor moves the simulated rows and never the measured ones."""
    out, _ = run
    profile = load_profile(out / "served.json")
    (recorded,) = profile.hosts.active
    args = ["--from", str(out), "--profile", str(out / "served.json"), "--host-typical"]
    result = CliRunner().invoke(validate, [*args, "--out", str(tmp_path / "alone")])
    assert result.exit_code == 0, result.output
    assert f"the typical host other than {recorded.host}: pass time x 1.0000" in result.output
    original, alone = (pd.read_csv(d / "validation.csv") for d in (out, tmp_path / "alone"))
    pd.testing.assert_frame_equal(original, alone)
    result = CliRunner().invoke(validate, [*args, "--host-of", f"{out}=another", "--out", str(tmp_path / "typ")])
    assert result.exit_code == 0, result.output
    assert f"pass time x {recorded.factor:.4f}" in result.output and recorded.factor != pytest.approx(1, abs=1e-4)
    typical = pd.read_csv(tmp_path / "typ" / "validation.csv")
    for source in ("server", "client"):
        assert (typical[typical.source == source].tpot_mean.values
                == original[original.source == source].tpot_mean.values).all()
    sim = {name: frame[frame.source == "sim"].e2e_mean.values for name, frame in (("typ", typical), ("", original))}
    assert (sim["typ"] != sim[""]).all()
    for extra, message in ((["--host-margin", "0.1"], "drop --host-margin"),
                           (["--profile", "builtin-llama-2-7b"], "hosts section holds active runs")):
        result = CliRunner().invoke(validate, [*args, "--out", str(tmp_path / "x"), *extra])
        assert result.exit_code == 2 and message in result.output, result.output


def test_a_run_compares_on_its_own_host_from_its_overload_passes(run, tmp_path):
    """``--host-from-overload`` slows each serving path by what the run's overload passes show (outside every cell;
    decode steps alone only in batches up to a cap): the factors are written, the simulated rows move and the
    measured rows stay; it needs a measured profile and refuses --host-margin beside it."""
    out, _ = run
    profile = load_profile(out / "served.json")
    (factors,) = overload_path_factors(out, profile)  # one engine
    assert factors and all(path in PATHS for path in factors) and all(f > 0 for f in factors.values())
    (without_decodes,) = overload_path_factors(out, profile, decode_max_seqs=0)  # the CPU's eager decode steps
    assert without_decodes.keys() <= factors.keys() and factors != pytest.approx(without_decodes)
    # a spread whose mean is 1.25 (here 1, 1, 1, 2) makes the simulated passes that much slower on average than
    # their median (the sweep's spread of this CPU's profile, ``swept``): the host's own excess over them is less
    spread = profile.with_serving(profile.serving.with_noise([1.0, 1.0, 1.0, 2.0]))
    (over_spread,) = overload_path_factors(out, spread)
    swept = mean_noise_factor(profile)
    assert over_spread == pytest.approx({path: f * swept / 1.25 for path, f in factors.items()})
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "own"), "--host-from-overload"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "own" / "host_factors.json").read_text()) == [pytest.approx(factors)]
    assert "its host, served / predicted loop time: " in result.output
    original, own = (pd.read_csv(d / "validation.csv") for d in (out, tmp_path / "own"))
    for source in ("server", "client"):
        assert (own[own.source == source].tpot_mean.values
                == original[original.source == source].tpot_mean.values).all()
    assert (own[own.source == "sim"].e2e_mean.values != original[original.source == "sim"].e2e_mean.values).any()
    for extra, message in ((["--host-margin", "0.1"], "drop --host-margin"), (["--profile", "builtin-llama-2-7b"],
                                                                             "measured profile")):
        args = ["--from", str(out), "--profile", str(out / "served.json"), "--out", str(tmp_path / "x"),
                "--host-from-overload", *extra]
        result = CliRunner().invoke(validate, args)
        assert result.exit_code == 2 and message in result.output, result.output


def test_decode_steps_take_the_mixed_factor_only_where_mixed_graphs_carried_the_prompts():
    """Below the graphs' tokens a splitfuse engine's prompts run beside its decodes as mixed graphs all through an
    overload run, and its decode steps take their factor; over them most such passes run eager, the mixed graphs are
    a few hot remainders, and the decode steps keep their own."""
    factors = {"decode-graph": 1.03, "mixed-graph": 1.07, "eager": 1.01}
    assert decode_steps_as_mixed(factors, {"decode-graph": 500, "mixed-graph": 900, "eager": 40}) == {
        **factors, "decode-graph": 1.07}
    assert decode_steps_as_mixed(factors, {"decode-graph": 500, "mixed-graph": 30, "eager": 350}) == factors
    assert decode_steps_as_mixed({"decode-graph": 1.03}, {"decode-graph": 500}) == {"decode-graph": 1.03}
    assert factors["decode-graph"] == 1.03  # the caller's mapping is left as it was


def test_a_repeated_grid_runs_round_after_round_on_fresh_prompt_tokens():
    """``--repeats 2``: the whole grid, then the whole grid again; a repeat sends the same lengths at the same
    times, but token ids of its own (a prompt sent again would hit the engine's prefix cache)."""
    cells = make_cells([("splitfuse", 768)], ["long", "short"], [0.5, 0.9], [], 10, 3, repeats=2)
    assert [c.repeat for c in cells] == [0] * 4 + [1] * 4
    assert [dataclasses.replace(c, repeat=0) for c in cells[4:]] == cells[:4]
    lengths = np.array([5, 9, 17])
    first, again, repeat = (cell_prompts(c, lengths, 1000) for c in (cells[0], cells[0], cells[4]))
    assert first == again and [len(p) for p in repeat] == [5, 9, 17] and repeat != first
    with pytest.raises(ValueError, match="--repeats"):
        make_cells([("splitfuse", 768)], ["long"], [0.5], [], 10, 0, repeats=0)


def test_a_repeated_grid_is_judged_on_each_cells_mean(run, tmp_path):
    """The simulator runs a repeated cell once and is judged against the mean of its repeats
    (``errors_repeats.csv``), beside the repeats' spread; ``errors.csv`` still judges each repeat alone."""
    out, _ = run
    args = ["tiny-llama", "--profile", str(out / "served.json"), "--device", "cpu", "--num-kv-blocks", "256",
            "--mix", MIX, "--loads", "0.5", "-n", "8", "--warmup", "0", "--client-processes", "2",
            "--saturation-from", str(out), "--repeats", "2", "--out", str(tmp_path)]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 0, result.output
    _, cells, _ = load_measured(tmp_path)
    assert [m.cell.repeat for _, m, _ in cells] == [0, 1]
    (_, a, _), (_, b, _) = cells
    assert [(r.prompt_tokens, r.max_tokens) for r in a.records] == [(r.prompt_tokens, r.max_tokens) for r in b.records]
    due = [m.cell.workload(m.rate).generate(m.cell.seed).arrivals for m in (a, b)]
    np.testing.assert_array_equal(*due)  # one schedule, sent again
    for m, schedule in zip((a, b), due):  # sent on it: never early (a loaded client may send late)
        assert all(r.arrival >= schedule[r.id] - 1e-3 for r in m.records)
    frame = pd.read_csv(tmp_path / "validation.csv")
    sim, client = frame[frame.source == "sim"], frame[frame.source == "client"]
    assert len(sim) == 2 and sim.tpot_mean.nunique() == 1
    assert len(pd.read_csv(tmp_path / "errors.csv")) == 4  # each repeat, server and client view
    repeats = pd.read_csv(tmp_path / "errors_repeats.csv").set_index("view")
    assert (repeats.repeats == 2).all() and "repeat" not in repeats.columns
    mean = client.tpot_mean.mean()
    assert repeats.loc["client", "tpot_mean"] == pytest.approx(sim.tpot_mean.iloc[0] / mean - 1)
    assert repeats.loc["client", "tpot_mean_spread"] == pytest.approx(client.tpot_mean.std() / mean)
    judged = ", ".join(f"{v} {int(repeats.loc[v, 'in_bounds'])} of 1" for v in ("server", "client"))
    assert f"each cell's mean of its repeats within the bounds (errors_repeats.csv): {judged}" in result.output


def test_each_clients_first_requests_can_be_left_out_of_both_sides(run, tmp_path):
    """``--exclude-first-requests``: the open-loop cell loses each client process's first request (2 processes),
    the closed-loop cell each client's first (2 clients); the simulator scores the same requests."""
    out, _ = run
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path), "--exclude-first-requests"])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(tmp_path / "validation.csv")
    assert (frame.requests == 8).all() and len(frame) == 8  # 2 cells x sim, sim-server, server, client
    _, cells, _ = load_measured(out)
    for _, m, _ in cells:
        kept = [r.chunk_times[0] - r.arrival for r in m.records if r.id >= 2]
        client = frame[(frame.source == "client") & (frame.clients == m.cell.clients)]
        assert client.ttft_mean.item() == pytest.approx(np.mean(kept))
    assert "Left out of both sides: each client&#x27;s first requests" in (tmp_path / "report.html").read_text()


def test_a_fleet_runs_behind_a_router_per_cell(cpu_profile, run, tmp_path):
    """Two engines (CPU slots) behind ``splitfuse serve --replica-url``, a router per cell, on one engine's
    saturation rate from the earlier run (``--saturation-from``) times two; every engine's passes traced; the
    random balancer sends each request where the simulator's does (both seeded with the cell's seed): checked on a
    one-client cell, whose requests reach the router one after another."""
    earlier, _ = run
    args = ["tiny-llama", "--profile", str(cpu_profile), "--device", "cpu", "--num-kv-blocks", "256", "--mix", MIX,
            "--loads", "0.5", "--clients", "1", "-n", "12", "--warmup", "4", "--client-processes", "2",
            "--replicas", "2",
            "--balancer", "round-robin", "--balancer", "random", "--saturation-from", str(earlier),
            "--out", str(tmp_path)]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 0, result.output
    assert "measured saturation" not in result.output  # taken from the earlier run
    one = json.loads((earlier / "meta.json").read_text())["saturation_rps"]["splitfuse-768"]["tiny"]
    assert json.loads((tmp_path / "meta.json").read_text())["saturation_rps"]["splitfuse-768-x2"]["tiny"] == \
        pytest.approx(2 * one)
    frame = pd.read_csv(tmp_path / "validation.csv")
    assert len(frame) == 2 * 2 * 4 and set(frame.balancer) == {"round-robin", "random"}
    assert (frame.replicas == 2).all() and (frame.requests == 12).all()
    assert frame.rate.dropna().to_numpy() == pytest.approx(0.5 * 2 * one)
    passes = pd.read_csv(tmp_path / "passes.csv")
    assert set(passes.replica) == {0, 1}  # round-robin alone gives each engine work
    assert (tmp_path / "trace-splitfuse-768-x2-r1.jsonl").exists()
    replica_of = {}  # per response id: the engine that served it
    for i, path in enumerate(trace_files(tmp_path, "splitfuse-768-x2", 2)):
        for r in map(json.loads, path.read_text().splitlines()):
            if r["kind"] != "pass":
                replica_of[r["id"]] = i
    _, runs, _ = load_measured(tmp_path)
    (cell, records), = [(m.cell, m.records) for _, m, _ in runs if m.cell.balancer == "random" and m.cell.clients]
    # One client: each request is sent when the last one has finished, so the router draws in send order. (Open-loop
    # requests from several client processes can reach it out of order, some on a fresh connection.)
    served = [replica_of[r.response_id] for r in sorted(records, key=lambda r: r.arrival)]
    balancer = make_balancer("random", cell.seed)
    assert served == [balancer.choose([None, None]) for _ in served]
    assert set(served) == {0, 1}
    # routing.csv: every cell simulated with its balancer's routes and with the measured router's; where the two
    # agree (the one-client random cell), so do the simulator's errors
    routing = pd.read_csv(tmp_path / "routing.csv")
    assert len(routing) == 2 * 2 * 2 and sorted(routing.routes.unique()) == ["balancer", "measured"]
    assert "fleet cells, mean |error| against the client" in result.output
    # the router's hop: the fleet cells' admission over the profile's mean for each prompt
    profile = load_profile(earlier / "served.json")
    serving = profile.serving
    _, runs, traces = load_measured(tmp_path)
    waits = [traces[name][1][r.response_id]["received"] - m.t0 - r.arrival
             - (serving.admission_per_token_s * r.prompt_tokens + np.mean(serving.admission_q))
             for name, m, _ in runs for r in m.records]
    line, hop_in, hop_out = router_hop(tmp_path, profile)
    assert hop_in == pytest.approx(np.mean(waits), abs=1e-6) and np.isfinite(hop_out)
    # its line over the streams open when each request was sent (the others sent before and not yet finished): the
    # least-squares line, kept non-negative; no worse than a flat line or one through the origin
    streams = np.array([sum(o.arrival < r.arrival < (o.chunk_times[-1] if o.chunk_times else o.arrival)
                            for o in m.records) for _, m, _ in runs for r in m.records], dtype=float)
    waits = np.array(waits)

    def misfit(a, b):
        return float(np.sum((a + b * streams - waits) ** 2))

    a, b = line.admission_s, line.admission_per_stream_s
    assert a >= 0 and b >= 0
    assert misfit(a, b) <= min(misfit(max(waits.mean(), 0), 0),
                               misfit(0, max(streams @ waits / max(streams @ streams, 1), 0))) + 1e-12
    slope, intercept = np.polyfit(streams, waits, 1) if streams.std() else (0.0, waits.mean())
    if slope >= 0 and intercept >= 0:
        assert (a, b) == pytest.approx((intercept, slope), abs=1e-9)
    assert "the router's hop over the profile's admission" in result.output
    assert router_hop(earlier, profile) is None  # one engine: no router
    same = routing[(routing.balancer == "random") & (routing.clients == 1)].set_index("routes")
    metrics = ["ttft_mean", "tpot_mean", "e2e_mean", "throughput_rps"]
    assert same.loc["balancer", metrics].to_numpy() == pytest.approx(same.loc["measured", metrics].to_numpy())
    # its saturation rate came from the earlier run: no overload run of its own to measure its cards on
    result = CliRunner().invoke(validate, ["--from", str(tmp_path), "--profile", str(earlier / "served.json"),
                                           "--out", str(tmp_path / "own"), "--host-from-overload"])
    assert result.exit_code == 1 and "traced no overload run" in result.output, result.output


def test_a_fleet_compares_each_engine_on_its_own_card(cpu_profile, run, tmp_path):
    """A fleet that measures its own saturation rate (through its router) traces both engines in that overload run;
    ``--host-from-overload`` then slows each simulated engine by its own passes there, not the pair's."""
    earlier, _ = run
    fleet = tmp_path / "fleet"
    args = ["tiny-llama", "--profile", str(cpu_profile), "--device", "cpu", "--num-kv-blocks", "64", "--mix", MIX,
            "--loads", "0.5", "-n", "8", "--warmup", "0", "--client-processes", "2", "--replicas", "2",
            "--balancer", "round-robin", "--out", str(fleet)]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 0, result.output
    assert "measured saturation" in result.output
    profile = load_profile(earlier / "served.json")
    factors = overload_path_factors(fleet, profile)
    # one per engine; a path counts with MIN_PATH_PASSES back-to-back passes, which two engines on two busy CPU cores
    # need not both reach
    assert len(factors) == 2 and any(factors)
    (_, overload, info), = [r for r in load_measured(fleet, "calibration")[1] if r[1].cell.load is None]
    rows = pd.DataFrame(cell_passes(overload, read_traces(trace_files(fleet, "splitfuse-768-x2", 2))[0], profile))
    rows = rows.dropna(subset=["loop_s", "predicted_s"])
    rows = rows[(rows.prefill_tokens > 0) | (rows.num_seqs <= OVERLOAD_DECODE_MAX_SEQS)]
    rows["scaled"] = [scale_path(path, decodes) for path, decodes in zip(rows.path, rows.decode_tokens)]
    mean = mean_noise_factor(profile)  # over the simulator's mean pass, not its median
    for engine, paths in enumerate(factors):  # each engine's own passes
        for path, factor in paths.items():
            mine = rows[(rows.replica == engine) & (rows.scaled == path)]
            assert factor == pytest.approx(mine.loop_s.sum() / (mean * mine.predicted_s.sum()))
    result = CliRunner().invoke(validate, ["--from", str(fleet), "--profile", str(earlier / "served.json"),
                                           "--out", str(tmp_path / "own"), "--host-from-overload"])
    assert result.exit_code == 0, result.output
    assert "engine 0, served / predicted" in result.output and "engine 1, served / predicted" in result.output
    assert json.loads((tmp_path / "own" / "host_factors.json").read_text()) == [pytest.approx(f) for f in factors]


def test_a_run_of_several_engines_takes_one_cost_or_one_per_engine():
    """``engine_costs``: one cost for all, a list of one for all, a longer list cut to the engines; too few refused."""
    assert engine_costs("a", 2) == ["a", "a"] and engine_costs(["a"], 2) == ["a", "a"]
    assert engine_costs(["a", "b", "c"], 2) == ["a", "b"]
    with pytest.raises(ValueError, match="2 cost models for a run of 3 engines"):
        engine_costs(["a", "b"], 3)


def test_a_fleet_needs_known_balancers():
    with pytest.raises(ValueError, match="unknown balancer"):
        make_cells([("splitfuse", 768)], ["long"], [0.5], [], 10, 0, replicas=2, balancers=("fastest",))


def test_saturation_is_the_steady_rate_even_when_batches_finish_together():
    """A lockstep scheduler finishing 100 requests every 10 s sustains 10 requests/s. The 10th-90th percentile
    window of one batch's finish times said thousands (all requests of an overload run fit one batch)."""
    lockstep = np.repeat(10.0 * np.arange(1, 4), 100) + np.linspace(0, 0.05, 300)
    assert steady_throughput(lockstep, 100) == pytest.approx(10, rel=0.01)
    one_batch = lockstep[:100]
    lo, hi = np.quantile(one_batch, [0.1, 0.9])
    assert np.count_nonzero((one_batch >= lo) & (one_batch <= hi)) / (hi - lo) > 1000  # the old estimate
    continuous = np.sort(np.random.default_rng(0).uniform(0, 60, 600))  # 10 requests/s, no batching
    assert steady_throughput(continuous, 50) == pytest.approx(10, rel=0.05)
    with pytest.raises(ValueError, match="need 300"):
        steady_throughput(one_batch, 100)


def test_an_overload_run_is_long_enough_to_measure_a_steady_rate():
    """Three batches at least, and enough completions between the first and the last for a stable rate: 47 slots
    (llama-2-13b's long mix on an H200) once got 150 requests, so 56 completions, and host-to-host rates 15% apart."""
    assert overload_requests(150, 47) == 2 * 47 + STEADY_COMPLETIONS
    assert overload_requests(150, 256) == 768
    assert overload_requests(1000, 47) == 1000
    assert overload_requests(10, 1) == 2 + STEADY_COMPLETIONS


def test_requests_at_the_context_limit_ask_for_what_the_engine_gives(cpu_profile, tmp_path):
    # prompts of up to 40 tokens and 5 new ones overrun a 42-token context: the server refuses such a max_tokens
    # (as vLLM does), so the client asks for what the engine (and the simulated engine) would produce
    out = tmp_path / "v"
    args = ["tiny-llama", "--profile", str(cpu_profile), "--device", "cpu", "--num-kv-blocks", "256",
            "--max-model-len", "42", "--mix", MIX, "--loads", "0.5", "-n", "10", "--warmup", "4",
            "--client-processes", "1", "--out", str(out)]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 0, result.output
    assert (pd.read_csv(out / "validation.csv").requests == 10).all()


def test_runs_compared_together_pool_their_serving_fit(run, cpu_profile, tmp_path):
    """``--from A --from B`` compares each run into its own folder; ``--fit-serving`` fits on the warm-up and
    overload runs of both (here the same run twice: twice the passes). A run of closed-loop cells alone has no
    overload run, so no requests to fit admission and delivery on: a clear error, not a traceback."""
    import shutil

    out, _ = run
    for name in ("a", "b"):
        shutil.copytree(out, tmp_path / name)
    one = json.loads((out / "served.json").read_text())["serving"]["fit"]
    args = ["--from", str(tmp_path / "a"), "--from", str(tmp_path / "b"), "--profile", str(cpu_profile),
            "--out", str(tmp_path / "both"), "--fit-serving", str(tmp_path / "pooled.json")]
    result = CliRunner().invoke(validate, args)
    assert result.exit_code == 0, result.output
    pooled = json.loads((tmp_path / "pooled.json").read_text())["serving"]["fit"]
    assert pooled["loop"]["n"] == 2 * one["loop"]["n"] and pooled["admission"]["n"] == 2 * one["admission"]["n"]
    for name in ("a", "b"):
        assert len(pd.read_csv(tmp_path / "both" / name / "validation.csv")) == 2 * 4
    shutil.copytree(out, tmp_path / "elsewhere" / "a")
    result = CliRunner().invoke(validate, ["--from", str(tmp_path / "a"), "--from", str(tmp_path / "elsewhere" / "a"),
                                           "--profile", str(cpu_profile), "--out", str(tmp_path / "same")])
    assert result.exit_code == 2 and "distinct names" in result.output

    closed = tmp_path / "closed"
    shutil.copytree(out, closed)
    rows = [json.loads(line) for line in (closed / "measured.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r.get("role", "cell") == "cell" or r["cell"]["clients"]]
    assert len(kept) < len(rows)  # the overload run is gone
    (closed / "measured.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    result = CliRunner().invoke(validate, ["--from", str(closed), "--profile", str(cpu_profile),
                                           "--out", str(tmp_path / "c"), "--fit-serving", str(tmp_path / "c.json")])
    assert result.exit_code == 1 and "--fit-serving: fitting the serving" in result.output
    assert "needs at least 10 measurements" in result.output and "Traceback" not in result.output


def older_copy(run_dir: Path, into: Path) -> Path:
    """A copy of a run as runs were before they recorded their host."""
    import shutil

    shutil.copytree(run_dir, into)
    meta = json.loads((into / "meta.json").read_text())
    del meta["host"]
    (into / "meta.json").write_text(json.dumps(meta))
    return into


def test_each_serving_measurement_names_its_host(run, cpu_profile, tmp_path):
    """The host ``meta.json`` records, else the one the caller names, else (an older run) the run's folder."""
    out, _ = run
    profile = load_profile(cpu_profile)
    recorded = json.loads((out / "meta.json").read_text())["host"]["hostname"]
    older = older_copy(out, tmp_path / "older")
    for directory, label, host in ((out, None, recorded), (out, "host-9", "host-9"), (older, None, "older"),
                                   (older, "host-9", "host-9")):
        passes, requests = serving_measurements(directory, profile, label)
        assert passes and requests and {r["host"] for r in passes + requests} == {host}
    assert run_host({"note": "cut short: no meta.json"}, Path("runs/a")) == "a"


def test_runs_labelled_with_one_host_weigh_as_one(run, cpu_profile, tmp_path):
    """Two older runs count as two hosts, named by their folders; ``--host-of`` makes them one."""
    out, _ = run
    runs = [older_copy(out, tmp_path / name) for name in ("a", "b")]
    base = ["--from", str(runs[0]), "--from", str(runs[1]), "--profile", str(cpu_profile)]
    fits = {}
    for name, labels in (("apart", []), ("together", [f"--host-of={r}=host-9" for r in runs])):
        result = CliRunner().invoke(validate, [*base, *labels, "--out", str(tmp_path / name),
                                               "--fit-serving", str(tmp_path / f"{name}.json")])
        assert result.exit_code == 0, result.output
        fits[name] = json.loads((tmp_path / f"{name}.json").read_text())["serving"]["fit"]
    assert fits["apart"]["path_scale"]["eager"]["host_levels"].keys() == {"a", "b"}
    assert "hosts" not in fits["together"]["path_scale"]["eager"]


@pytest.mark.parametrize("label, message", [("{other}=host-9", "is not one of the --from runs"),
                                            ("host-9", "expected DIR=LABEL")])
def test_a_host_label_names_a_compared_run(tmp_path, label, message):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    label = label.format(other=tmp_path / "b")
    result = CliRunner().invoke(validate, ["--from", str(tmp_path / "a"), "--host-of", label,
                                           "--profile", "llama-2-7b-h200-bf16", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and f"--host-of {label!r}: " in result.output and message in result.output


def test_the_simulators_spread_over_seeds_is_written_beside_its_answer(run, tmp_path):
    """``--sim-seeds 4``: every cell's workload simulated on 4 seeds (pass-time noise and serving delays differ,
    the requests do not); the compared ``sim`` row stays that of the cell's own seed."""
    out, _ = run
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"),
                                           "--out", str(tmp_path), "--sim-seeds", "4"])
    assert result.exit_code == 0, result.output
    spread = pd.read_csv(tmp_path / "sim_seeds.csv")
    assert len(spread) == 2 * 7 and (spread.seeds == 4).all()
    assert ((spread["min"] <= spread["mean"]) & (spread["mean"] <= spread["max"])).all()
    assert (spread[spread.metric == "ttft_mean"]["std"] > 0).all()  # admission draws differ by seed
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "validation.csv"), pd.read_csv(out / "validation.csv"))


def _clock_log(path: Path, spans: list[tuple[float, float, int]]) -> None:
    """An nvidia-smi clock log (``benchmarks.clock_bias``'s format) sampling every 50 ms over each (start, end,
    MHz) span of the run's perf_counter clock."""
    wall0 = 1.8e9
    lines = [f"anchor {wall0} 0.0"]
    for start, end, mhz in spans:
        for t in np.arange(start, end, 0.05):
            stamp = datetime.datetime.fromtimestamp(wall0 + t, datetime.timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")
            lines.append(f"{stamp[:-3]}, 0, {mhz}, 3201, 650.0, 60, 0x0000000000000004")
    path.write_text("\n".join(lines) + "\n")


def test_clock_bias_weighs_each_cells_lowered_clock_against_the_calibration_runs(cpu_profile, run, tmp_path):
    """A card at full clock through the warm-up and overload runs and lowered through every cell: each cell is off
    by its path's slowdown at a lowered clock (CPU passes are all eager); at full clock throughout, by nothing."""
    from benchmarks.clock_bias import clock_bias

    out, _ = run
    profile = load_profile(cpu_profile)
    _, calibration, _ = load_measured(out, "calibration")
    _, cells, _ = load_measured(out, "cell")
    spans = [(*m.window, 1980) for _, m, _ in calibration]
    spans += [(*m.window, 1700) for _, m, _ in cells]
    _clock_log(tmp_path / "clocks.csv", sorted(spans))
    slowdown, table = clock_bias(out, tmp_path / "clocks.csv", profile)
    assert slowdown["eager"] != 0 and len(table) == len(cells)
    assert (table["calibration eager lowered_%"] == 0).all()
    assert table["eager lowered_%"].to_numpy() == pytest.approx(100)
    assert table["eager time_%"].to_numpy() == pytest.approx(100)
    assert table["bias_%"].to_numpy() == pytest.approx(100 * slowdown["eager"])
    _clock_log(tmp_path / "full.csv", [(min(s for s, _, _ in spans), max(e for _, e, _ in spans), 1980)])
    slowdown, table = clock_bias(out, tmp_path / "full.csv", profile)
    assert slowdown["eager"] == 0 and (table["bias_%"] == 0).all() and (table["eager lowered_%"] == 0).all()
    (tmp_path / "bad.csv").write_text("2026/11/27 10:27:55.749, 0, 345\n")
    with pytest.raises(ValueError, match="anchor"):
        clock_bias(out, tmp_path / "bad.csv", profile)
    from benchmarks.clock_bias import main as clock_bias_cli
    result = CliRunner().invoke(clock_bias_cli, [str(out), str(tmp_path / "bad.csv"), str(cpu_profile)])
    assert result.exit_code == 1 and "first line must be 'anchor" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(clock_bias_cli, [str(out), str(tmp_path / "clocks.csv"), str(cpu_profile),
                                                 "--out", str(tmp_path / "bias.csv")])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(tmp_path / "bias.csv")) == len(cells)


def test_recorded_hosts_compare_each_overload_run_served_and_simulated(run, cpu_profile, tmp_path):
    """--record-hosts writes the profile with each run's host: its overload run's steady rate as served and as
    simulated on the same requests; a run added again replaces its row. --fit-serving records its runs' hosts
    against its own fit; both at once, or a run without an overload run, are refused by name."""
    out, _ = run
    served = load_profile(out / "served.json")
    assert served.hosts is not None and len(served.hosts.runs) == 1  # one overload run (the tiny mix)
    row = served.hosts.runs[0]
    assert row.host == run_host(json.loads((out / "meta.json").read_text()), out) and row.mix == "tiny"
    assert row.measured_rps > 0 and row.simulated_rps > 0 and row.commit == served.hosts.runs[0].commit
    assert row.run["mix"] == "tiny" and row.run["rate"] > 0 and row.run["kv_total_blocks"] > 0
    assert simulated_overload_rps(served, row.run) == pytest.approx(row.simulated_rps, rel=1e-9)  # simulated again
    recorded = tmp_path / "recorded.json"
    for _ in range(2):  # the second time from the file the first wrote: the same run replaces its row
        source = recorded if recorded.exists() else out / "served.json"
        result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(source), "--out",
                                               str(tmp_path / "c"), "--record-hosts", str(recorded),
                                               "--host-of", f"{out}=host-9"])
        assert result.exit_code == 0, result.output
        assert "hosts, simulated / served requests/s: " in result.output and "host-9 " in result.output
        hosts = load_profile(recorded).hosts
        assert [r.host for r in hosts.runs] == [row.host, "host-9"]
    assert hosts.runs[1].factor == pytest.approx(row.factor)
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "d"), "--record-hosts", str(tmp_path / "x.json"),
                                           "--fit-serving", str(tmp_path / "y.json")])
    assert result.exit_code == 2 and "drop --record-hosts" in result.output


def test_fit_noise_writes_the_served_spread_that_the_simulator_draws_from(run, cpu_profile, tmp_path):
    """--fit-noise measures the served passes' spread around the section's price on the warm-up and overload runs
    (each run over its median) and keeps the profile's hosts; a profile without a serving section is refused."""
    out, _ = run
    served = load_profile(out / "served.json")
    noisy = tmp_path / "noisy.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "c"), "--fit-noise", str(noisy)])
    assert result.exit_code == 0, result.output
    assert "served passes over their price" in result.output
    profile = load_profile(noisy)
    q, fit = profile.serving.noise_q, profile.serving.fit["noise"]
    assert len(q) == NOISE_QUANTILES and (np.diff(q) >= 0).all() and (q > 0).all()
    assert fit["hosts"] == 1 and fit["passes"] >= 20 and abs(np.median(q) - 1.0) < 0.05
    # every row that keeps its overload run is simulated again with the spread it now draws from
    assert [r.measured_rps for r in profile.hosts.runs] == [r.measured_rps for r in served.hosts.runs]
    assert [r.simulated_rps for r in profile.hosts.runs] == pytest.approx(
        [simulated_overload_rps(profile, r.run) for r in profile.hosts.runs], rel=1e-9)
    assert [r.simulated_rps for r in profile.hosts.runs] != [r.simulated_rps for r in served.hosts.runs]
    f = PassFeatures(8, 0, 8, 8, 0, 8 * 30, 0, 8)
    assert profile.predict(f) == served.predict(f)  # the medians stay the section's
    u = np.array([0.0, 0.5, 0.9999])
    assert profile.noise_factors(u) == [q[int(x * len(q))] for x in u]
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "d"), "--fit-noise", str(tmp_path / "x.json")])
    assert result.exit_code == 1 and "no serving section" in result.output and not (tmp_path / "x.json").exists()


def test_a_runs_host_is_its_cards_where_recorded():
    """Lent machines share one host name; their cards' UUIDs tell them apart (and two cards of one machine)."""
    meta = {"host": {"hostname": "vm", "gpus": [{"index": 0, "uuid": "GPU-592555b7-1570-64f7", "name": "H200"}]}}
    assert run_host(meta, Path("runs/a")) == "GPU-592555b7"
    assert run_host({"host": {"hostname": "vm", "gpus": []}}, Path("runs/a")) == "vm"
    assert run_host(meta, Path("runs/a"), "host-24") == "host-24"


def test_fit_levels_moves_a_paths_level_to_the_runs_median_host(run, cpu_profile, tmp_path):
    """--fit-levels refits the named paths' levels on the warm-up and overload passes, keeps the rest of the
    section and records the runs' hosts again; fitted on the runs its section came from, the level is the
    section's own. An unknown path, or --level-path alone, is refused by name."""
    out, _ = run
    served = load_profile(out / "served.json")
    fitted = served.serving.fit["path_scale"]
    path = max(fitted, key=lambda p: fitted[p]["n"])  # on the CPU every pass runs eagerly
    moved_file = tmp_path / "levels.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "c"), "--fit-levels", str(moved_file),
                                           "--level-path", path])
    assert result.exit_code == 0, result.output
    assert f"serving levels at heat 0, the hosts' median: {path}" in result.output
    moved = load_profile(moved_file)
    assert moved.serving.path_scale[path] == pytest.approx(served.serving.path_scale[path], rel=0.01)
    assert {p: v for p, v in moved.serving.path_scale.items() if p != path} == \
        {p: v for p, v in served.serving.path_scale.items() if p != path}
    assert moved.serving.heat_scale == served.serving.heat_scale
    assert list(moved.serving.fit["levels"]) == [path]
    assert [r.host for r in moved.hosts.runs] == [r.host for r in served.hosts.runs]
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "d"), "--fit-levels", str(tmp_path / "x.json"),
                                           "--level-path", "prefill"])
    assert result.exit_code == 1 and "unknown serving path 'prefill'" in result.output
    assert not (tmp_path / "x.json").exists()
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "e"), "--level-path", "decode-graph"])
    assert result.exit_code == 2 and "give --fit-levels FILE" in result.output
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "f"), "--level-growth"])
    assert result.exit_code == 2 and "--level-growth is for --fit-levels" in result.output
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "k"), "--fit-levels", str(tmp_path / "k.json"),
                                           "--keep-attention"])
    assert result.exit_code == 2 and "--keep-attention is for --level-growth" in result.output
    assert not (tmp_path / "k.json").exists()
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "h"), "--level-per-sample"])
    assert result.exit_code == 2 and "--level-per-sample is for --fit-levels" in result.output


def test_level_growth_fits_a_paths_heat_and_attention_on_the_cells_too(run, tmp_path):
    """--fit-levels --level-growth fits the path's heat growth and attention scale, from the warm-up, overload and
    cell passes (the cells' passes are the run's too), then its level at them; the fit says what it moved."""
    out, _ = run
    served = load_profile(out / "served.json")
    fitted = served.serving.fit["path_scale"]
    path = max(fitted, key=lambda p: fitted[p]["n"])
    bare = served.with_serving(None)
    calibration, with_cells = serving_measurements(out, bare)[0], serving_measurements(out, bare, cells=True)[0]
    assert len(with_cells) > len(calibration)
    assert pd.DataFrame(with_cells[:len(calibration)]).equals(pd.DataFrame(calibration))  # (NaN loops alike)
    grown_file = tmp_path / "grown.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "g"), "--fit-levels", str(grown_file), "--level-path", path,
                                           "--level-growth"])
    assert result.exit_code == 0, result.output
    assert f"; {path} heat " in result.output and "attention" in result.output
    grown = load_profile(grown_file)
    growth = grown.serving.fit["growth"][path]
    assert growth["heat_before"] == served.serving.heat_scale[path] and growth["n"] > 0
    assert list(grown.serving.fit["growth"]) == [path] == list(grown.serving.fit["levels"])
    assert {p: v for p, v in grown.serving.heat_scale.items() if p != path} == \
        {p: v for p, v in served.serving.heat_scale.items() if p != path}
    kept_file = tmp_path / "kept.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "kept"), "--fit-levels", str(kept_file), "--level-path",
                                           path, "--level-growth", "--keep-attention"])
    assert result.exit_code == 0, result.output
    kept = load_profile(kept_file)
    assert kept.serving.attention_scale == served.serving.attention_scale
    assert kept.serving.fit["growth"][path]["attention_kept"]


def test_a_pass_the_trace_names_as_discarding_a_step_is_no_level(run, tmp_path):
    """Each served pass carries the trace's ``discarded`` mark (a pass after a greedy step ahead that it threw away,
    which carries that step's work) into the rows the fits read, and the fits leave such passes out: with every pass
    so marked, no path has passes to fit a level on."""
    import shutil

    out, _ = run
    bare = load_profile(out / "served.json").with_serving(None)
    assert not any(row["discarded"] for row in serving_measurements(out, bare, cells=True)[0])
    marked = tmp_path / "marked"
    shutil.copytree(out, marked)
    for trace in marked.glob("trace-*.jsonl"):
        lines = [json.loads(line) for line in trace.read_text().splitlines()]
        trace.write_text("".join(json.dumps({**d, "discarded": True} if d.get("kind") == "pass" else d) + "\n"
                                 for d in lines))
    rows = serving_measurements(marked, bare, cells=True)[0]
    assert rows and all(row["discarded"] for row in rows)
    with pytest.raises(ValueError, match="no path has 10 passes"):
        fit_path_levels(rows, load_profile(out / "served.json").serving)


def test_a_sections_fit_takes_its_own_heat_time_constant(run):
    """A section being fitted on a bare profile has no heat of its own to time the passes' heat by: the fit names
    its time constant, which moves each pass's heat and nothing else."""
    out, _ = run
    bare = load_profile(out / "served.json").with_serving(None)
    fast, slow = (pd.DataFrame(serving_measurements(out, bare, cells=True, heat_tau_s=tau)[0]) for tau in (0.1, 2.0))
    assert fast.drop(columns="heat").equals(slow.drop(columns="heat"))
    assert (fast["heat"] != slow["heat"]).mean() > 0.5 and slow["heat"].between(0.0, 1.0).all()


def cheapest_sampled_pass(profile, n: int) -> float:
    """The lower of ``profile``'s prices for ``n`` decodes at context 1 and ``n`` one-token prompts."""
    return min(profile.predict(PassFeatures(n, 0, n, n, 0, n, 0, n, decode_max_context=1)),
               profile.predict(PassFeatures(n, n, 0, n, n, 0, n, n, prefill_max_context=1)))


def test_fit_levels_puts_the_sampler_saving_back_on_todays_runs(run, tmp_path):
    """A section's ``sampler_saved`` prices today's sampler against the sweep's, so its levels scale the sweep's
    price: fitted on a run of today's engine (recorded), each sampled step gets the saving back first, and the
    refitted section prices those steps as the unbridged one did. A run labelled as the sweep's sampler gets
    nothing back; an unknown label is refused by name."""
    out, _ = run
    assert json.loads((out / "meta.json").read_text())["sampler"] == SAMPLER_DRAW
    served = load_profile(out / "served.json")
    bare = served.with_serving(None)
    plain = pd.DataFrame(serving_measurements(out, bare)[0])
    back = pd.DataFrame(serving_measurements(out, bare, sampler_saved=lambda n, prefill: 1e-3 * n)[0])
    assert np.allclose(back["pass_s"] - plain["pass_s"], 1e-3 * plain["num_samples"], equal_nan=True)
    assert (plain["num_samples"] > 0).any()
    sort = pd.DataFrame(serving_measurements(out, bare, sampler_saved=lambda n, prefill: 1e-3 * n,
                                             sampler="sort")[0])
    assert sort["pass_s"].equals(plain["pass_s"])
    fitted = served.serving.fit["path_scale"]
    path = max(fitted, key=lambda p: fitted[p]["n"])
    unbridged = with_path_levels(served, (out,), {}, (path,))
    # half the cheapest pass of as many sampled entries: a refit simulates the run's overload again, where a larger
    # saving could price a small pass below zero
    batches = list(range(1, int(plain["num_samples"].max()) + 1))
    table = {"batches": batches, "seconds": [0.5 * cheapest_sampled_pass(unbridged, n) for n in batches]}
    bridged = served.with_serving(served.serving.with_sampler_saved({"decode": table, "mixed": table}))
    today = with_path_levels(bridged, (out,), {}, (path,))
    as_sort = with_path_levels(bridged, (out,), {}, (path,), samplers={out: "sort"})
    rows = serving_measurements(out, bare, heat_tau_s=served.serving.heat_tau_s,
                                sampler_saved=bridged.serving.sampler_saved_seconds)[0]
    level, level_today = unbridged.serving.path_scale[path], today.serving.path_scale[path]
    assert level_today == pytest.approx(fit_path_levels(rows, bridged.serving, (path,))[0][path])
    assert level_today > level * 1.05  # the steps dearer on the sweep's terms
    assert as_sort.serving.path_scale[path] == level  # the same steps, nothing put back
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "s"), "--sampler-of", f"{out}=argmax"])
    assert result.exit_code == 2 and "'argmax' is not one of sort, vocab-order" in result.output


def test_fit_loop_refits_the_loop_alone_and_keeps_the_rest(run, cpu_profile, tmp_path):
    """--fit-loop refits the serving loop's line on the runs' warm-up and overload passes: from a section whose loop
    is far off, it comes back to the line --fit-serving fitted on the same runs, the old line kept under the fit,
    every other term kept, the runs' hosts recorded again. A profile without a section is refused by name."""
    out, _ = run
    served = load_profile(out / "served.json")
    s = served.serving
    off = served.with_serving(s.with_loop(10 * s.per_pass_s, 10 * s.per_sample_s + 1e-6, 0.0, 0.0))
    off.save(tmp_path / "off.json")
    refitted_file = tmp_path / "loop.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(tmp_path / "off.json"), "--out",
                                           str(tmp_path / "c"), "--fit-loop", str(refitted_file)])
    assert result.exit_code == 0, result.output
    assert "serving loop: " in result.output and f"wrote {refitted_file}" in result.output
    refitted = load_profile(refitted_file).serving
    assert (refitted.per_pass_s, refitted.per_sample_s, refitted.loop_knee, refitted.per_sample_above_knee_s) == \
        pytest.approx((s.per_pass_s, s.per_sample_s, s.loop_knee, s.per_sample_above_knee_s))
    assert refitted.fit["loop"]["before"]["per_pass_s"] == pytest.approx(10 * s.per_pass_s)
    assert refitted.path_scale == s.path_scale and refitted.delivery_per_sample_s == s.delivery_per_sample_s
    assert [r.host for r in load_profile(refitted_file).hosts.runs] == [r.host for r in served.hosts.runs]
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "d"), "--fit-loop", str(tmp_path / "x.json")])
    assert result.exit_code == 1 and "no serving section whose loop to refit" in result.output
    assert not (tmp_path / "x.json").exists()


def test_loop_cells_fits_the_loop_on_the_cells_passes_alone(run, tmp_path):
    """--fit-loop with --loop-cells fits the line on the cells' passes alone: as many as the compared cells traced
    with the loop's work timed (passes.csv, written apart from the fit), none of the warm-up and overload runs', and
    says so in the fit; --loop-cells without --fit-loop is refused by name."""
    out, _ = run
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "c"), "--fit-loop", str(tmp_path / "cells.json"),
                                           "--loop-cells"])
    assert result.exit_code == 0, result.output
    assert "hosts, cells); wrote" in result.output
    fit = load_profile(tmp_path / "cells.json").serving.fit["loop"]
    cells = pd.read_csv(out / "passes.csv")
    traced = cells[np.isfinite(cells["serving_s"])]
    assert fit["source"] == "cells" and fit["n"] == len(traced)
    calibrated = with_loop(load_profile(out / "served.json"), (out,), {}).serving.fit["loop"]
    assert calibrated["source"] == "warm-up and overload runs" and calibrated["n"] != fit["n"]
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "d"), "--loop-cells"])
    assert result.exit_code == 2 and "--loop-cells is for --fit-loop" in result.output


def test_loop_phases_split_each_loop_and_price_it(run, capsys):
    """``python -m sim.loop_phases``: every sampled step's loop (update to the next start) is its three phases, the
    steps of each kind of run are binned by sampled entries, and a profile's price stands beside them; a folder that
    is no validate run, a path no step ran and two runs of one name are refused by name."""
    out, _ = run
    rows = loop_rows(out)
    # a light cell's steps may all take in a request; the overload run's many do not
    assert "overload" in set(rows["kind"]) <= {"warm-up", "overload", "cell"} and set(rows["path"]) == {"eager"}
    assert (rows[["outputs_s", "send_s", "rest_s"]] >= 0).all().all() and (rows["num_samples"] > 0).all()
    parts = rows["outputs_s"] + rows["send_s"] + rows["rest_s"]
    assert np.allclose(parts, rows["loop_s"]) and (rows["loop_s"] <= MAX_LOOP_S).all()
    table = phase_table(rows, [2, 8, 4096], lambda n: 1e-4 + 1e-6 * n)
    assert table["steps"].sum() == len(rows)
    assert set(table.index.get_level_values("kind")) == set(rows["kind"])
    medians = rows.groupby(["run", "kind", pd.cut(rows["num_samples"], [0, 2, 8, 4096])], observed=True)
    assert list(table["price_us"]) == [round(100 + int(n), 0) for n in medians["num_samples"].median()]
    assert np.allclose(table["loop_over_price"], (table["loop_us"] / table["price_us"]).round(2))
    loop_phases_main([str(out), "--path", "eager", "--profile", str(out / "served.json")])
    assert "loop_over_price" in capsys.readouterr().out
    for argv, message in (([str(out / "nothing")], "no measured.jsonl"), ([str(out)], "the path 'decode-graph'"),
                          ([str(out), str(out)], "folders of distinct names")):
        with pytest.raises(SystemExit):
            loop_phases_main(argv)
        assert message in capsys.readouterr().err


def test_a_run_of_another_model_is_refused_by_name(run, cpu_profile, tmp_path):
    """A --from run is compared, fitted and recorded against the profile's model only: a profile of another model
    stops the command with a usage error that names both, before anything is written."""
    out, _ = run
    other = json.loads(Path(cpu_profile).read_text())
    other["meta"]["model"] = "llama-2-7b"
    (tmp_path / "other.json").write_text(json.dumps(other))
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(tmp_path / "other.json"), "--out",
                                           str(tmp_path / "c"), "--record-hosts", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and f"--from {out} served tiny-llama, but the profile prices llama-2-7b" \
        in result.output
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "c").exists()


def test_level_per_sample_needs_graph_passes_and_says_so(run, tmp_path):
    """--level-per-sample fits the served step's work per sampled entry on the graph paths; a CPU run serves every
    pass eager, so it stops with an error that names what is missing, and writes nothing."""
    out, _ = run
    target = tmp_path / "per-sample.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "p"), "--fit-levels", str(target), "--level-per-sample"])
    assert result.exit_code == 1 and "--fit-levels: no host has 10 passes that sample on a graph path" in result.output
    assert not target.exists()


def test_fit_step_knee_needs_large_graph_steps_and_says_so(run, tmp_path):
    """--fit-step-knee fits what graph steps save past the knee on the runs' sampled warm-up and overload passes; a
    CPU run serves every pass eager, so it stops with an error that names what is missing and writes nothing, and
    --step-knee alone is refused as a usage error."""
    out, _ = run
    target = tmp_path / "knee.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "k"), "--fit-step-knee", str(target), "--step-knee", "4"])
    assert result.exit_code == 1 and "--fit-step-knee: no host has 10 passes past 4 sampled entries on a graph " \
        "path" in result.output
    assert not target.exists()
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "k"), "--step-knee", "4"])
    assert result.exit_code == 2 and "--step-knee is for --fit-step-knee" in result.output


def test_fit_greedy_needs_greedy_runs_and_says_so(run, tmp_path):
    """--fit-greedy fits on runs sent at temperature 0; this run's were sampled (and a CPU run's passes are eager),
    so it stops with an error that names what is missing and how to send them, and writes nothing; --greedy-cells
    without --fit-greedy is refused by name."""
    out, _ = run
    target = tmp_path / "greedy.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "g"), "--fit-greedy", str(target)])
    assert result.exit_code == 1 and "--fit-greedy: no host served 10 greedy decode-graph steps of the kind 'step'" \
        in result.output and "--temperature 0" in result.output
    assert not target.exists()
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "c"), "--greedy-cells"])
    assert result.exit_code == 2 and "--greedy-cells is for --fit-greedy" in result.output


def test_fit_buckets_needs_mixed_graph_passes_and_says_so(run, cpu_profile, tmp_path):
    """--fit-buckets prices the mixed-graph paths per graph bucket; a CPU run's passes are all eager, so it stops
    with an error that names what is missing and writes nothing; a profile without a serving section is refused."""
    out, _ = run
    target = tmp_path / "buckets.json"
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(out / "served.json"), "--out",
                                           str(tmp_path / "b"), "--fit-buckets", str(target)])
    assert result.exit_code == 1 and "--fit-buckets: no mixed-graph path has 10 passes of a bucket" in result.output
    assert not target.exists()
    result = CliRunner().invoke(validate, ["--from", str(out), "--profile", str(cpu_profile), "--out",
                                           str(tmp_path / "c"), "--fit-buckets", str(target)])
    assert result.exit_code == 1 and "no serving section whose paths to price per bucket" in result.output
    assert not target.exists()


def _overload_factors(directory, kinds, cost, temperature=1.0):
    """``overload_path_factors`` of a hand-made overload run whose passes follow one another: (path, ahead,
    seconds) each, a prompt's pass on the mixed graph."""
    passes, start = [], 0.0
    for path, ahead, seconds in kinds:
        passes.append({"start": start, "sent": start + seconds, "updated": start + seconds, "end": start + seconds,
                       "path": path, "ahead": ahead, "num_outputs": 1, **dict.fromkeys(PassFeatures._fields, 1),
                       "prefill_tokens": 8 if path == "mixed-graph" else 0})
        start += seconds
    directory.mkdir()
    trace = [json.dumps({"kind": "pass", **p}) for p in passes]
    (directory / "trace-splitfuse.jsonl").write_text("\n".join(trace) + "\n")
    cell = Cell("splitfuse", 768, "tiny", "fixed:8", "fixed:2", 1, temperature=temperature)  # no load: overload
    row = {"role": "calibration", "server": "splitfuse", "cell": dataclasses.asdict(cell), "rate": 10.0,
           "records": [], "t0": 0.0, "window": [0.0, start], "info": {"kv_total_blocks": 64, "max_model_len": 64}}
    (directory / "measured.jsonl").write_text(json.dumps(row) + "\n")
    (factors,) = overload_path_factors(directory, cost)
    return factors


def test_a_greedy_overload_run_reads_its_card_on_every_decode_step(tmp_path):
    """A card's factor from a greedy overload run counts each decode step at its greedy price, those enqueued ahead
    too: they are most of a greedy cell's steps."""

    class Price(ConstantCost):  # every pass 10 ms; a step ahead priced at 8
        def greedy_seconds(self, f, kind, price):
            return 0.8 * price if kind == "ahead" else None

    # alternately not ahead (on its price) and ahead (10% over its price)
    kinds = [("decode-graph", i % 2 == 1, 0.0088 if i % 2 else 0.010) for i in range(60)]
    factors = _overload_factors(tmp_path / "greedy", kinds, Price(0.010), temperature=0.0)
    timed_ahead, timed_not = 29, 30  # the last pass (ahead) has no next one to end its loop
    served = timed_ahead * 0.0088 + timed_not * 0.010
    assert factors["decode-graph"] == pytest.approx(served / (timed_ahead * 0.008 + timed_not * 0.010))
    assert factors["decode-graph"] > 1.04  # the steps ahead run 10% over, the others on their price


def test_a_splitfuse_card_reads_its_decode_steps_by_its_mixed_passes(tmp_path):
    """An overload run's decode steps alone (the first batch filling, the last draining) misread a splitfuse card:
    where the engine ran mixed graph passes, its decode steps take their factor; without any, their own."""
    decodes = [("decode-graph", False, 0.011)] * 30  # 10% over their price
    mixed = [("mixed-graph", False, 0.0102)] * 30  # 2% over
    assert _overload_factors(tmp_path / "decodes", decodes, ConstantCost(0.010)) == \
        {"decode-graph": pytest.approx(1.1)}
    factors = _overload_factors(tmp_path / "splitfuse", decodes + mixed + decodes, ConstantCost(0.010))
    assert factors == {"decode-graph": pytest.approx(1.02), "mixed-graph": pytest.approx(1.02)}


def test_greedy_ratios_take_the_discards_the_trace_names(tmp_path):
    """The served passes a greedy fit reads: each decode step's saving, ahead or not, and what a pass that discarded
    the step ahead took beyond its price. A trace that names discards (``PassRecord.discarded``) is read as named;
    an older one is guessed at only under a scheduler that puts decodes first (prefill-first enqueues nothing ahead
    of a step in which a request starts a KV block, so a prompt after a decode step need not have discarded one).
    Each is read against the price a greedy pass starts from: the sampled price with what the sampler saves since
    the sweep given back, since a greedy pass never runs the sampler."""

    class Serving:  # the sampler saves 1 ms on a pass that samples
        def sampler_saved_seconds(self, num_samples, prefill_tokens=0):
            return 0.001 if num_samples else 0.0

    class Price:  # every pass 10 ms, on a card without heat
        serving = Serving()

        def new_heat(self):
            return None

        def predict(self, f, heat=0.0):
            return 0.010

    def traced(start, length, prefill, ahead=False):
        return {"start": start, "sent": start + length, "updated": start + length, "end": start + length,
                "path": "mixed-graph" if prefill else "decode-graph", "ahead": ahead, "num_outputs": 1,
                **dict.fromkeys(PassFeatures._fields, 1), "prefill_tokens": prefill}

    def write_run(directory, scheduler, named, role="calibration", cells=False):
        # a decode step, one ahead, a prompt's pass 4 ms over its price (discarding a step ahead), a decode step
        passes = [traced(0.0, 0.010, 0), traced(0.010, 0.008, 0, ahead=True), traced(0.018, 0.014, 8),
                  traced(0.032, 0.010, 0), traced(0.042, 0.010, 0)]
        if named:  # as the engine writes them: every pass says whether it discarded one
            for i, p in enumerate(passes):
                p["discarded"] = i == 2
        directory.mkdir()
        trace = [json.dumps({"kind": "pass", **p}) for p in passes]
        trace.append(json.dumps({"kind": "request", "id": "r", "token_times": [0.052]}))
        (directory / f"trace-{scheduler}.jsonl").write_text("\n".join(trace) + "\n")
        cell = Cell(scheduler, 768, "tiny", "fixed:8", "fixed:2", 1, temperature=0.0)
        row = {"role": role, "server": scheduler, "cell": dataclasses.asdict(cell), "rate": None,
               "records": [{"id": 0, "prompt_tokens": 8, "max_tokens": 2, "response_id": "r"}], "t0": 0.0,
               "window": [0.0, 1.0], "info": {}}
        (directory / "measured.jsonl").write_text(json.dumps(row) + "\n")
        return greedy_ratios(directory, Price(), host="h", cells=cells)

    rows = write_run(tmp_path / "named", "prefill-first", named=True)
    assert [r["kind"] for r in rows] == ["ahead", "discarded", "step"]  # the trace's first and last are not timed
    # the step ahead served in 8 ms of 11; the prompt's pass 3 ms over 11, a share of the step before's 11
    assert rows[0]["saved_s"] == pytest.approx(0.003) and rows[1]["ratio"] == pytest.approx(0.003 / 0.011)
    assert rows == write_run(tmp_path / "old", "splitfuse", named=False)
    assert [r["kind"] for r in write_run(tmp_path / "old-prefill-first", "prefill-first", named=False)] == \
        ["ahead", "step"]
    # --greedy-cells reads the cells' passes alone, the default the warm-up and overload runs' alone
    assert write_run(tmp_path / "cell", "prefill-first", named=True, role="cell", cells=True) == rows
    assert write_run(tmp_path / "cell-not-read", "prefill-first", named=True, role="cell") == []
    assert write_run(tmp_path / "calibration-not-read", "prefill-first", named=True, cells=True) == []


def test_every_shipped_host_that_keeps_its_run_reads_its_profile():
    """A measured host's simulated rate holds for the profile it was simulated with: each shipped row that keeps its
    overload run is simulated again on the shipped profile and must read what the row says (``rehosted``)."""
    from calibration.profile import shipped_profiles

    rows = [(name, row) for name in shipped_profiles() if load_profile(name).hosts is not None
            for row in load_profile(name).hosts.runs if row.run]
    assert rows  # the rows recorded since profile format 22
    for name, row in rows:
        assert simulated_overload_rps(load_profile(name), row.run) == pytest.approx(row.simulated_rps, rel=1e-6), \
            (name, row.host, row.mix)
