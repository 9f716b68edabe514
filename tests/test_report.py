"""``report.html`` says what ran, with units everywhere, shares, rates and latencies apart, and confidence bands from
every replication."""

import re

import numpy as np
import plotly.io
import pytest

from engine.policy import PolicyConfig
from sim import report_figures
from sim.capacity import load_sweep
from sim.cluster import ClusterConfig, simulate
from sim.metrics import SLA, summarize
from sim.report import write_report
from sim.workload import Workload

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs():
    config = ClusterConfig("llama-2-7b", replicas=3, policy=PolicyConfig(balancer="power-of-two"))
    workload = Workload(num_requests=240, rate=15.0)
    results = [simulate(workload, config, seed=s, warmup=0.1) for s in SEEDS]
    sweep = load_sweep(Workload(num_requests=120), config, [8.0, 16.0], SEEDS)
    return results, sweep


@pytest.fixture(scope="module")
def html(runs, tmp_path_factory):
    results, sweep = runs
    return write_report(tmp_path_factory.mktemp("report") / "report.html", results, SLA(), sweep).read_text()


def figures_of(html: str) -> list[tuple[list, dict]]:
    """(data, layout) of each plotly figure in a report, as plotly.js draws it."""
    import json

    calls = re.findall(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(.*?)\)\s*\};?", html, flags=re.S)
    return [tuple(json.loads("[" + call + "]")[:2]) for call in calls]


def test_the_report_says_what_ran(html):
    """Before: it never said which profile, rate or replica count ran."""
    table = html[html.index("Run configuration"):html.index("Summary")]
    for row, value in (("profile", "llama-2-7b-h100-bf16.json (shipped)"), ("card", "H100"), ("model", "llama-2-7b"),
                       ("scheduler", "splitfuse"), ("token budget", "768 tokens per pass"),
                       ("balancer", "power-of-two"), ("replicas", "3"), ("rate", "15 req/s"),
                       ("seeds", "0 to 2 (3 replications)"), ("commit", "")):
        assert re.search(f"<td>{row}</td><td>[^<]*{re.escape(value)}", table), row


def test_every_summary_row_has_a_unit_and_no_raw_keys(html):
    """Before: 50 raw summary keys (ttft_p95, sla_share@4, ...) without units."""
    summary = html[html.index("<h2>Summary"):html.index("<h2>Load sweep")]
    rows = re.findall(r"<tr>\s*<th>([^<]+)</th>\s*<td>([^<]+)</td>\s*<td>([^<]+)</td>", summary)
    assert len(rows) >= 15
    for name, mean, interval in rows:
        assert re.search(r"(s|req/s|tokens/s|tokens|%|requests| J| W|kWh)$|^\d[\d,]*$", mean), (name, mean)
        assert " to " in interval, (name, interval)
        assert not re.search(r"-\d|\b(10[1-9]|1[1-9]\d)\.\d%", interval), (name, interval)  # within the range
    assert not re.search(r"\b(ttft_p95|sla_share|throughput_rps)\b", summary)


def decoded(values) -> np.ndarray:
    """A trace's array as plotly.js receives it (plotly encodes numpy arrays as base64 with their dtype)."""
    import base64

    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values)


def axis_groups(fig: dict) -> dict:
    """(x axis, y axis) -> the names of the traces drawn on them."""
    groups = {}
    for trace in fig["data"]:
        key = (trace.get("xaxis", "x"), trace.get("yaxis", "y"))
        groups.setdefault(key, []).append(trace.get("name", ""))
    return groups


def axis_title(layout: dict, axis: str) -> str:
    name = axis[0] + "axis" + axis[1:]
    title = layout.get(name, {}).get("title", {})
    return title.get("text", "") if isinstance(title, dict) else str(title)


def test_every_axis_has_a_unit_and_one_kind_of_quantity(html):
    """Before: the SLA share (0-1) and requests/s shared one unlabelled axis, and TPOT lay flat beside e2e."""
    figs = figures_of(html)
    assert len(figs) == 6
    units = re.compile(r"\((s|req/s|%|tokens|count|index|tokens/s)\)$|^s$")
    for data, layout in figs:
        for (x, y), names in axis_groups({"data": data}).items():
            for axis in (x, y):
                title = axis_title(layout, axis)
                assert units.search(title), (layout.get("title"), axis, title)
            joined = " ".join(names).lower()
            assert not ("share" in joined and "req/s" in joined), names
            assert not ("tpot" in joined and ("end-to-end" in joined or "ttft" in joined)), names


def test_bands_come_from_every_replication(runs, html):
    """Before: no confidence bands, and only the first replication was shown."""
    results, _ = runs
    figs = figures_of(html)
    bands = [t for data, _ in figs for t in data if t.get("fill") == "toself"]
    assert len(bands) >= 10 and all(t["name"].endswith("95% CI") for t in bands)
    load = next(data for data, layout in figs if layout["title"]["text"] == "Per-replica load")
    requests = np.array([r.replicas.sort_values("replica")["requests"] for r in results], dtype=float)
    assert np.allclose(decoded(load[0]["y"]), requests.mean(axis=0))  # the mean over all three replications
    assert "Measured requests of 3 replications" in html


def test_the_light_report_is_small_and_says_it_needs_the_network(runs, tmp_path):
    results, sweep = runs
    light = write_report(tmp_path / "light.html", results, SLA(), sweep, light=True).read_text()
    full = write_report(tmp_path / "full.html", results, SLA(), sweep).read_text()
    assert len(light) < 400_000 < 4_000_000 < len(full)
    assert 'src="https://cdn.plot.ly' in light and "https://cdn.plot.ly" not in full.split("<h2>")[0]
    assert light.count("plotly-graph-div") == full.count("plotly-graph-div")


def test_figures_build_without_a_sweep_and_with_one_replication(runs):
    results, _ = runs
    one = results[:1]
    for fig in (report_figures.latency_cdfs(one), report_figures.replica_load(one),
                report_figures.sla_attainment([summarize(one[0])])):
        assert not [t for t in fig.data if t.type == "scatter" and t.fill == "toself"]  # no band from one run
        plotly.io.to_json(fig)
