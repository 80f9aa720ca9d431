"""``set_parallel`` + ``runner(indices)`` and the feature/statistics demo on the real SLURM of tests/infra.

    eval "$(tests/infra/up.sh slurm)"
    .venv/bin/python -m pytest tests/integration/test_runner_backends.py

Asserted: the shards run inside SLURM jobs, the merged outputs are byte-identical to the in-process
run, and no job of the run is left in the queue.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dtmf_demo.dtmf import make_corpus
from espnet3_prefect import set_parallel
from espnet3_prefect.execution import process_parallel as parallel_config
from tests.conftest import ROOT, write_yaml
from tests.helpers.workloads import LogProvider, SquareRunner, forward_jobs
from tests.integration.test_real_backends import batch_parallel, queue_jobs, slurm  # noqa: F401 - fixture

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture(autouse=True)
def no_registered_parallel():
    parallel_config._reset()
    yield
    parallel_config._reset()


def test_runner_call_after_set_parallel_runs_its_shards_as_slurm_jobs(slurm, prefect_server, tmp_path):
    local = SquareRunner(LogProvider({}), 3, tmp_path / "local")(range(30))
    log = tmp_path / "log"
    set_parallel(batch_parallel(slurm, n_workers=2))
    runner = SquareRunner(LogProvider({"log": str(log)}), 3, tmp_path / "slurm")
    assert runner(range(30)) == local
    assert (tmp_path / "slurm/out.txt").read_bytes() == (tmp_path / "local/out.txt").read_bytes()
    jobs = forward_jobs(log)
    assert jobs and "-" not in jobs  # every item ran inside a SLURM job
    assert not [j for j in queue_jobs("slurm") if j[0] in jobs]  # and none is left behind


def _stats_outputs(stats_dir: Path) -> dict:
    out = {name: (stats_dir / name).read_bytes() for name in ("feats_shape", "feats_stats.npz", "stats.json")}
    out["feats.scp"] = (stats_dir / "feats.scp").read_text().replace(str(stats_dir), "<stats_dir>")
    return out


def test_stats_demo_same_command_on_slurm_as_in_process(slurm, prefect_server, tmp_path):
    from dtmf_demo.stats import main

    make_corpus(tmp_path / "data/tiny", 40, seed=5, noise_db=-25.0)
    data = "data=[{name: tiny, data_dir: " + str(tmp_path / "data/tiny") + "}]"
    config = str(ROOT / "recipes/dtmf/conf/stats.yaml")
    here = main(["--config", config, "~parallel", data, f"stats_dir={tmp_path / 'here'}"])
    slurm_yaml = write_yaml(tmp_path / "parallel_slurm.yaml", {"parallel": batch_parallel(slurm, n_workers=2)})
    there = main(["--config", config, str(slurm_yaml), data, f"stats_dir={tmp_path / 'slurm'}"])
    assert here["utterances"] == there["utterances"] == 40 and here["frames"] == there["frames"]
    assert _stats_outputs(tmp_path / "here") == _stats_outputs(tmp_path / "slurm")
    assert list((tmp_path / "slurm/.dask-jobs").iterdir())  # the job logs sit beside the shards
