"""The analysis notebooks run top to bottom on shipped data, each stating its answer in a sentence with the numbers
that carry it, and are stored without outputs."""

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
UNITS = r"(req/s|tokens/s|tokens per pass| s\b|ms\b|%)"


def test_the_notebooks_of_the_analysis_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_cost_curves.ipynb", "02_schedulers.ipynb", "03_load_balancing.ipynb",
                                           "04_sim_vs_engine.ipynb", "05_scaling.ipynb", "06_host_margins.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_are_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_states_its_answer(path):
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors[0]["evalue"] if errors else ""
    answers = [line for o in outputs if o.get("name") == "stdout" for line in o["text"].splitlines()
               if line.startswith("Answer")]
    assert len(answers) == 1, answers
    answer = answers[0]
    assert len(re.findall(r"\d+(?:\.\d+)?", answer)) >= 4 and re.search(UNITS, answer), answer
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs), "no figure"
