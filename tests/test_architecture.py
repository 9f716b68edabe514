"""The import graph keeps the design's shape: the policy layer stands alone and torch-free, the engine,
calibration and kernels never reach the simulator, and no modules import each other in a circle.

The graph is read statically by grimp (the library behind import-linter), so imports inside functions count too.
"""

from __future__ import annotations

import graphlib

import grimp
import pytest

PACKAGES = ("engine", "sim", "calibration", "kernels", "splitfuse")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)


def find_cycle(graph: grimp.ImportGraph, packages=PACKAGES) -> list[str] | None:
    """One circle of imports among the modules of ``packages`` (as a list that starts and ends with the same
    module), or None."""
    ours = {m for m in graph.modules if m.split(".")[0] in packages}
    deps = {m: graph.find_modules_directly_imported_by(m) & ours for m in ours}
    try:
        tuple(graphlib.TopologicalSorter(deps).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_the_policy_layer_imports_no_other_part_of_the_project_and_no_torch(graph):
    upstream = graph.find_upstream_modules("engine.policy", as_package=True)
    assert {m for m in upstream if m.split(".")[0] in PACKAGES} == set(), "engine.policy must stand alone"
    assert "torch" not in upstream and "transformers" not in upstream


@pytest.mark.parametrize("package", ["engine", "calibration", "kernels"])
def test_only_the_simulator_and_the_cli_import_the_simulator(graph, package):
    chain = graph.find_shortest_chain(importer=package, imported="sim", as_packages=True)
    assert chain is None, f"{package} reaches the simulator: {' -> '.join(chain)}"


def test_no_import_cycles(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    g = grimp.ImportGraph()
    for importer, imported in (("engine.a", "engine.b"), ("engine.b", "engine.c"), ("engine.c", "engine.a"),
                               ("engine.c", "engine.d")):
        g.add_import(importer=importer, imported=imported)
    cycle = find_cycle(g)
    assert cycle is not None and set(cycle) == {"engine.a", "engine.b", "engine.c"}
    g.remove_import(importer="engine.c", imported="engine.a")
    assert find_cycle(g) is None
