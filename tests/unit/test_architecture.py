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


def test_internal_helpers_import_nothing_of_ours_but_the_errors():
    for module, targets in edges().items():
        if module.startswith(f"{P}._internal"):
            assert targets <= {f"{P}.errors", *(t for t in targets if t.startswith(f"{P}._internal"))}, module


def test_the_pipeline_never_imports_prefect_flows_or_tasks():
    """The driver is given an executor; which tasks run the steps is the flows' business."""
    for module, targets in edges().items():
        if module.startswith(f"{P}.pipeline"):
            above = sorted(t for t in targets if t.startswith((f"{P}.flows", f"{P}.tasks", f"{P}.cli")))
            assert not above, f"{module} imports {above}"


# Each step of the data path, the module named after it and what a reader finds there first (the done
# marker is on-disk vocabulary: the ground floor's).
DATA_PATH = {
    "pipeline.plan": "plan_shards",
    "pipeline.env": "EnvPlugin",
    "pipeline.shard": "process_shard",
    "disk.marker": "write_marker",
    "pipeline.merge": "merge_stage",
    "pipeline.summary": "StageSummary",
    "pipeline.driver": "drive_stage",
}


def test_each_data_path_step_lives_in_the_module_named_after_it():
    import importlib

    for step, name in DATA_PATH.items():
        module = importlib.import_module(f"{P}.{step}")
        assert getattr(module, name).__module__ == module.__name__, (step, name)


def test_every_prefect_flow_and_task_name_is_registered_once():
    import importlib
    import pkgutil

    from prefect import Flow
    from prefect.tasks import Task

    names: dict[str, list[str]] = {}
    for package in ("flows", "tasks"):
        pkg = importlib.import_module(f"{P}.{package}")
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name == "forkserver_warm":  # importing it warms the fork server up: nothing registered
                continue
            module = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for attr, value in vars(module).items():
                if isinstance(value, (Flow, Task)) and value.__module__ == module.__name__:
                    names.setdefault(f"{type(value).__name__}:{value.name}", []).append(f"{module.__name__}.{attr}")
    assert {"Flow:infer", "Flow:run-runner", "Task:build-env", "Task:merge", "Task:run-shard"} <= set(names)
    twice = {name: where for name, where in names.items() if len(where) > 1}
    assert not twice, twice
