"""The package keeps the shape docs/architecture.md draws: no import cycle, and imports only go down
the layers (scripts/import_graph.py reads every import statement, also those inside functions)."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)

P = "espnet3_prefect"
FOUNDATION = {f"{P}.errors", f"{P}._internal.util", f"{P}._internal.proc"}
FRONT_DOORS = (f"{P}.cli", f"{P}.entry")  # the shell's and Python's way in: they start flows


def edges() -> dict[str, set[str]]:
    return import_graph.graph()


def test_no_import_cycle():
    assert import_graph.cycles(edges()) == []


def test_imports_go_down_the_layers():
    graph = edges()
    for module, targets in graph.items():
        for target in targets:
            if target.startswith(f"{P}.cli"):
                assert module.startswith(f"{P}.cli"), f"{module} imports the command line ({target})"
            if target.startswith(f"{P}.flows"):
                assert module.startswith((f"{P}.flows", *FRONT_DOORS)), f"{module} imports a flow ({target})"
            if target.startswith(f"{P}.tasks"):
                assert module.startswith((f"{P}.tasks", f"{P}.flows")), f"{module} imports a task ({target})"
    for module, targets in graph.items():
        if module.startswith(f"{P}.execution.backends"):
            outside = {t for t in targets if not t.startswith(f"{P}.execution.backends")} - FOUNDATION
            assert not outside, f"{module} reaches out of the backends package: {sorted(outside)}"
