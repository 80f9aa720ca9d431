"""Runner classes that subclass the real ESPnet3 202611 run through ``espnet3_prefect.run`` (the flow
``run-runner`` on a real LocalCluster) with the output upstream's own ``runner(indices)`` writes.

Needs espnet3 importable (the parity venv: scripts/parity_setup.sh); skips otherwise.
"""

from __future__ import annotations

import pytest

pytest.importorskip("espnet3.parallel.base_runner", reason="espnet3 (202611) is not importable here")

from espnet3_prefect import run  # noqa: E402
from espnet3_prefect.execution import process_parallel as parallel_config  # noqa: E402
from tests.helpers.upstream_workloads import UpProvider, UpSquares, up_inference_runner  # noqa: E402

pytestmark = pytest.mark.slow
LOCAL2 = {"env": "local", "n_workers": 2, "num_shards": 3}


@pytest.fixture(autouse=True)
def upstream_runs_locally():
    """Upstream's ``runner(...)`` is the oracle in its local mode (no parallel config registered)."""
    from espnet3.parallel import parallel as upstream_parallel

    assert upstream_parallel.get_parallel_config() is None
    parallel_config._reset()
    yield


@pytest.mark.parametrize("indices", [list(range(17)), [9, 2, 2, 16, 0, 5, 11]], ids=["range", "explicit"])
def test_upstream_base_runner_subclass_through_run_matches_upstream_call(prefect_server, tmp_path, indices):
    upstream = UpSquares(UpProvider({"n": 17, "scale": 2}), batch_size=2, output_dir=tmp_path / "upstream")
    ours = UpSquares(UpProvider({"n": 17, "scale": 2}), batch_size=2, output_dir=tmp_path / "ours")
    expected = upstream(indices)
    assert run(ours, indices, parallel=LOCAL2) == expected
    assert (tmp_path / "ours/all.jsonl").read_bytes() == (tmp_path / "upstream/all.jsonl").read_bytes()
    assert sorted(p.name for p in (tmp_path / "ours").glob("split.*")) == ["split.0", "split.1", "split.2"]
    assert run(ours, indices, parallel=LOCAL2) == expected  # resumed from our markers


def test_upstream_stock_inference_runner_through_run_matches_upstream_call(prefect_server, tmp_path):
    up = up_inference_runner(11, tmp_path / "upstream", batch_size=3)
    assert up(range(11)) is True  # upstream's __call__ returns True; run() returns what merge returns
    run(up_inference_runner(11, tmp_path / "ours", batch_size=3), range(11), parallel=LOCAL2)
    for name in ("hyp.scp", "ref.scp"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "upstream" / name).read_bytes()
