"""The reports render in a real headless Chromium with the network off: every figure drawn, offline.

Needs Debian's ``chromium`` (``.ci/run`` installs it and sets ``SPLITFUSE_REQUIRE_BROWSER=1``, so there a missing
browser fails the test instead of skipping it). The network is cut by sending every request to a closed proxy
port and resolving no host; the light report, which loads plotly.js from its CDN, is the check that it is cut.
"""

import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

from calibration.cli import profile as profile_cli
from sim.cli import simulate as simulate_cli

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
if BROWSER is None and not os.environ.get("SPLITFUSE_REQUIRE_BROWSER"):
    pytest.skip("no chromium here (apt-get install chromium)", allow_module_level=True)


def render(path) -> str:
    """The DOM of ``path`` after its scripts ran, in headless Chromium without a network."""
    assert BROWSER, "SPLITFUSE_REQUIRE_BROWSER is set but there is no chromium on PATH"
    out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
                          "--virtual-time-budget=20000", "--dump-dom", f"file://{path}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "</html>" in out.stdout, out.stderr[-2000:]
    return out.stdout


class Figures(HTMLParser):
    """Per plotly figure div: whether plotly.js turned it into a plot, and how many traces it drew."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict] = []
        self.depth = 0  # element depth inside the current figure div (0: outside)

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if self.depth:
            self.depth += tag not in ("path", "rect", "line", "circle", "stop", "br", "img", "use")
            figure = self.figures[-1]
            figure["svg"] += tag == "svg" and "main-svg" in classes
            figure["traces"] += "trace" in classes
        elif "plotly-graph-div" in classes:
            self.figures.append({"plotted": "js-plotly-plot" in classes, "svg": 0, "traces": 0})
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth and tag not in ("path", "rect", "line", "circle", "stop", "br", "img", "use"):
            self.depth -= 1


def figures_in(dom: str) -> list[dict]:
    parser = Figures()
    parser.feed(dom)
    return parser.figures


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for kind in ("full", "light"):
        path = tmp_path_factory.mktemp(kind)
        result = CliRunner().invoke(simulate_cli, ["-n", "150", "--replicas", "2", "--replications", "2",
                                                   "--rates", "10,20", "--max-requests-per-replica", "300",
                                                   "--out", str(path), "--report", kind])
        assert result.exit_code == 0, result.output
        out[kind] = path / "report.html"
    return out


def test_every_figure_of_the_report_renders_offline(reports):
    figures = figures_in(render(reports["full"]))
    assert len(figures) == 6
    assert all(f["plotted"] and f["svg"] and f["traces"] for f in figures), figures


def test_the_network_really_is_off(reports):
    """The light report needs plotly.js from its CDN: with the network cut, nothing of it renders."""
    figures = figures_in(render(reports["light"]))
    assert len(figures) == 6 and not any(f["plotted"] for f in figures)


def test_profile_plots_render_offline(tmp_path):
    """Before: ``splitfuse profile --check X --plot`` wrote HTML that loaded plotly from a CDN: blank offline."""
    result = CliRunner().invoke(profile_cli, ["--check", "llama-2-7b", "--plot", str(tmp_path)],
                                env={"BROWSER_PATH": "/nonexistent"})  # HTML only: PNG export is tested elsewhere
    assert result.exit_code == 0, result.output
    (html,) = tmp_path.glob("*.html")
    figures = figures_in(render(html))
    assert len(figures) == 4 and all(f["plotted"] and f["traces"] for f in figures), figures


def test_kaleido_exports_a_png_through_the_distributions_chromium(tmp_path):
    """PNG export (``profile --check --plot``) needs only the kaleido dependency and Debian's chromium."""
    from calibration.plots import figures
    from calibration.profile import load_profile

    path = tmp_path / "accuracy.png"
    figures(load_profile("llama-2-7b"))["accuracy"].write_image(path, width=400, height=300)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
