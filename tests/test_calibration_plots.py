"""A profile's figures: offline HTML, readable log ticks, decodes by context, predicted against measured, and a
whole message when PNG export cannot run."""

import re
import subprocess
import sys

import numpy as np
import pytest

from calibration.plots import figures, log_ticks, write_plots
from calibration.profile import load_profile, point_features


@pytest.fixture(scope="module")
def figs():
    return figures(load_profile("llama-2-7b"))


def test_log_axes_label_their_ticks_plainly(figs):
    """Before: log axes showed plotly's bare minor labels."""
    assert log_ticks(3, 9000) == ([2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000],
                                  ["2", "5", "10", "20", "50", "100", "200", "500", "1k", "2k", "5k", "10k"])
    log_axes = [axis for fig in figs.values() for name, axis in fig.layout.to_plotly_json().items()
                if re.fullmatch(r"[xy]axis\d*", name) and axis.get("type") == "log"]
    assert len(log_axes) >= 5
    assert all(axis.get("tickvals") and len(axis["ticktext"]) == len(axis["tickvals"]) for axis in log_axes)


def test_decode_points_and_model_curves_are_split_by_context(figs):
    """Before: decodes at every context were one colour and only the 1k-context curve was drawn."""
    names = [t.name for t in figs["latency"].data]
    curves = [n for n in names if n.startswith("model: decodes at")]
    groups = {re.search(r"~([\d,]+) context", n).group(1) for n in names if n.startswith("decode at ~")}
    assert len(curves) >= 3 and {"128", "1,024", "4,096"} <= groups
    colors = {t.marker.color for t in figs["latency"].data if t.name.startswith("decode at ~")}
    assert len(colors) == len(groups)
    assert any(t.name.startswith("model: batch") for t in figs["context"].data)


def test_predicted_against_measured(figs):
    """Before: no plot of the model's predictions against the measurements."""
    data = {t.name: t for t in figs["accuracy"].data if t.xaxis in (None, "x")}  # the left panel
    profile = load_profile("llama-2-7b")
    held = [p for p in profile.points if p["split"] == "heldout"]
    assert np.allclose(np.sort(data["heldout points"].x), np.sort([p["wall_s"] * 1e3 for p in held]))
    # the swept model's predictions, as the fit scores them: not the served engine's (its serving section adds the
    # loop's work between steps, which no swept pass contains)
    swept = [profile.model.predict(point_features(p)) * 1e3 for p in held]
    assert np.allclose(np.sort(data["heldout points"].y), np.sort(swept))
    assert "predicted = measured" in data and "+8%" in data
    errors = [t for t in figs["accuracy"].data if t.xaxis == "x2"]
    assert sum(len(t.y) for t in errors) == len(profile.points)


def test_the_html_embeds_plotly_and_holds_every_figure(tmp_path):
    written = write_plots(load_profile("llama-2-7b"), tmp_path, png=False)
    (html,) = written
    text = html.read_text()
    assert "cdn.plot.ly" not in text.split("<body>")[0] and "plotly.js v" in text  # plotly.js itself is inside
    assert text.count("Plotly.newPlot(") == 4


def test_a_failed_png_export_says_why_whole_and_what_to_do(tmp_path):
    """Before: a missing kaleido printed only the first line of plotly's message, cut off mid-sentence. In its own
    process: plotly remembers a failed kaleido import, which would break PNG export for every later test."""
    code = ("import sys; sys.modules['kaleido'] = None  # makes ``import kaleido`` fail\n"
            "from calibration.plots import write_plots\nfrom calibration.profile import load_profile\n"
            f"print([p.suffix for p in write_plots(load_profile('llama-2-7b'), {str(tmp_path)!r})])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    err = out.stderr
    assert out.returncode == 0 and out.stdout.strip() == "['.html']", err[-2000:]
    assert "pip install --upgrade \"kaleido>=1\"" in err and "apt-get install chromium" in err
    assert err.count("no PNG written") == 1
