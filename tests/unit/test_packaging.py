"""What the extras in pyproject.toml install is what the code needs (read from the file: no install)."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def extras() -> dict[str, list[Requirement]]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        table = tomllib.load(handle)["project"]["optional-dependencies"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in table.items()}


@pytest.mark.parametrize(("extra", "bindings"), [("gpu", "cu12"), ("gpu-cu13", "cu13")])
def test_gpu_extra_installs_dask_cuda_with_its_cuda_bindings(extra, bindings):
    """dask_cuda imports cuda.core, which imports cuda.bindings: only dask-cuda[cu12|cu13] brings them
    (dask-cuda 26.10's metadata: cu12 -> cuda-core[cu12] -> cuda-bindings[all]==12.*)."""
    [req] = [r for r in extras()[extra] if r.name == "dask-cuda"]
    assert req.extras == {bindings}
    assert req.specifier.contains("26.10.0") and not req.specifier.contains("26.8.0")


RANGED = ("prefect", "fastapi", "prefect-dask", "dask", "distributed")


def dependencies() -> dict[str, Requirement]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        reqs = [Requirement(r) for r in tomllib.load(handle)["project"]["dependencies"]]
    return {r.name: r for r in reqs}


@pytest.mark.parametrize("name", RANGED)
def test_orchestration_dependencies_are_ranges_whose_lower_end_ci_installs(name):
    """A range, not a pin (users install beside their own Prefect and Dask), with an upper bound; its
    lowest version is the one .ci/constraints-lowest.txt pins for CI's lowest-versions tier."""
    spec = dependencies()[name].specifier
    lowest = {
        Requirement(line).name: Requirement(line)
        for line in (ROOT / ".ci" / "constraints-lowest.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    [pin] = lowest[name].specifier
    assert pin.operator == "==", lowest[name]
    operators = {s.operator: s.version for s in spec}
    assert operators.get(">=") == pin.version, (name, str(spec), pin.version)
    assert "<" in operators or "<=" in operators, f"{name}: no upper bound in {spec}"
