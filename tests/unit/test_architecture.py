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


# The house, ground floor first (docs/architecture.md draws the same): a package imports only packages on
# the floors below its own; on one floor only the front doors reach each other (launch -> entry). The
# server is a plug built on the ground floor that only the front doors reach, hence its floor under them.
FLOORS = (
    ("errors",),
    ("_internal", "main_guard"),
    ("disk",),  # the on-disk vocabulary and the client file
    ("config",),
    ("espnet3",),  # ESPnet3's classes: nothing of the orchestration
    ("execution",),
    ("pipeline",),
    ("metrics",),
    ("checkpoints",),
    ("recipe",),  # the recipe as one run: the stage rule, records, the stage loop
    ("tasks",),
    ("flows",),
    ("server",),  # the plug
    ("entry", "launch", "cli", P),  # the front doors
)
FLOOR = {package: level for level, floor in enumerate(FLOORS) for package in floor}


def arrows_up(packages: dict[str, dict[str, int]]) -> list[str]:
    """The package arrows that do not run down the house (up, or across a floor but the front doors')."""
    top = len(FLOORS) - 1
    return sorted(
        f"{source} -> {target}"
        for source, arrows in packages.items()
        for target in arrows
        if FLOOR[target] > FLOOR[source] or (FLOOR[target] == FLOOR[source] and FLOOR[source] != top)
    )


def test_every_package_has_a_floor():
    assert set(import_graph.package_graph(edges())) == set(FLOOR)


def test_every_package_folder_is_installed():
    """A new package must be in pyproject.toml's list, or a wheel installs without it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {name for name, path in import_graph.modules().items() if path.name == "__init__.py"}
    assert folders <= listed, sorted(folders - listed)


def test_packages_depend_one_way_down_the_house():
    packages = import_graph.package_graph(edges())
    assert import_graph.cycles({p: set(a) for p, a in packages.items()}) == []
    assert arrows_up(packages) == []


def test_arrows_up_are_found():
    """The check sees a knot: the config layer reaching the pipeline, the server reached from a flow."""
    knot = {"config": {"pipeline": 2}, "flows": {"server": 1}, "launch": {"entry": 1}, "disk": {"errors": 1}}
    assert arrows_up(knot) == ["config -> pipeline", "flows -> server"]


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
