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
