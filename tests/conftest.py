"""Shared fixtures: one real Prefect server per test session (127.0.0.1, free port), configs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml

# --doctest-modules imports every module under tests/: the helpers that subclass the real espnet3
# classes only where espnet3 is importable (their tests skip otherwise).
collect_ignore = [] if importlib.util.find_spec("espnet3") else ["helpers/upstream_workloads.py"]
# tests/infra/ holds the scripts that bring the real schedulers up (run by .ci/run and by hand), not
# tests: collection never imports them, so a machine with no scheduler collects the suite cleanly.
collect_ignore_glob = ["infra/*"]

ROOT = Path(__file__).resolve().parents[1]
FSDD = ROOT.parent / "shared" / "data" / "fsdd" / "recordings"

# The test files that take longest (seconds of one pytest process, CI's 2 cores, infra up, 2026-11-27),
# collected first and in this order: .ci/run gives whole files to two pytest-xdist workers in
# collection order (--dist loadfile --no-loadscope-reorder), so the long ones start first and the
# short ones fill in at the end, instead of one worker finishing alone on a long file. Order only:
# every file's own tests keep their order, and a run of one worker runs the same tests.
LONGEST_FIRST = (
    # estimated, not yet timed in CI: its one test on SQLite (221 s) and on PostgreSQL
    "tests/integration/test_checkpoint_events.py",  # ~440 s
    # estimated: a lab's server restarted mid-run 4 ways (one outage of 2 min), a driver killed in one
    "tests/integration/test_server_outage.py",  # ~350 s
    "tests/parity/test_parity.py",  # 325 s
    "tests/integration/test_deployments.py",  # 230 s on SQLite, + ~35 s on PostgreSQL (estimated)
    "tests/integration/test_real_backends.py",  # 294 s, mostly waiting on SLURM's walltime
    "tests/integration/test_security_api.py",  # 224 s, + ~50 s on PostgreSQL (estimated)
    "tests/integration/test_task_runner_contract.py",  # 239 s
    "tests/integration/test_reliability.py",  # ~200 s: worker kills, a busy server, a disk filling
    "tests/integration/test_leftovers.py",  # ~130 s: drivers SIGKILLed, deploy-local --stop
    "tests/integration/test_stage_jobs_slurm.py",  # ~150 s (estimated): a placed train and infer on SLURM
    "tests/integration/test_browser_ui.py",  # 110 s
    "tests/integration/test_real_oar.py",  # 86 s
    "tests/integration/test_deployment_outage.py",  # ~120 s (estimated): a deployment's run outliving a restart
    "tests/integration/test_server_faults.py",  # ~120 s: servers SIGKILLed mid-run, one past api_outage_s
    "tests/integration/test_worker_api_cutoff.py",  # ~90 s (estimated): workers cut off from the API
    "tests/integration/test_server_ui.py",  # 82 s
    "tests/integration/test_lab_server.py",  # ~120 s (estimated): two deploy-local --postgres starts
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable
    # a file whose server fixture runs on both databases (tests.helpers.postgres.DATABASES) runs on
    # PostgreSQL only its tests marked `postgres`: what a database changes, not everything twice
    twice = [
        item
        for item in items
        if "postgres" in getattr(getattr(item, "callspec", None), "params", {}).values()
        and item.get_closest_marker("postgres") is None
    ]
    if twice:
        config.hook.pytest_deselected(items=twice)
        items[:] = [item for item in items if item not in twice]


# Batch jobs and spawned workers import tests.helpers.* too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect API server for the session; its URL is exported to workers."""
    from espnet3_prefect.server.embedded import _flush_prefect
    from espnet3_prefect.server.process import start_server, stop_server
    from tests.helpers.prefect_db import seed

    home = seed(tmp_path_factory.mktemp("prefect-server"))
    proc, url = start_server(home, ui=False)
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ["PREFECT_API_URL"] = url
    os.environ["PREFECT_HOME"] = str(home / "client")
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_HOME: str(home / "client")}):
        yield url
        _flush_prefect()
    stop_server(proc.pid)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def write_yaml(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def toy_config(
    tmp_path: Path, n: int = 23, *, n_workers: int = 2, num_shards: int = 5, batch_size=None, bad=None, **extra
) -> dict:
    """An ESPnet3-shaped inference config for the toy recipe (logs go next to the outputs)."""
    cfg = {
        "inference_dir": str(tmp_path / "inference"),
        "toy": {"build_log": str(tmp_path / "builds.log")},
        "dataset": {
            "_target_": "tests.helpers.toy.ToyOrganizer",
            "test": [{"name": "test_a", "n": n, **({"bad": bad} if bad else {})}],
        },
        "model": {"_target_": "tests.helpers.toy.ToyModel", "scale": 3},
        "input_key": "x",
        "output_fn": "tests.helpers.toy.toy_output_fn",
        "idx_key": "utt_id",
        "batch_size": batch_size,
        "provider": {
            "_target_": "tests.helpers.toy.CountingProvider",
            "params": {"forward_log": str(tmp_path / "forward.log")},
        },
        "runner": {"_target_": "tests.helpers.toy.CountingRunner", "resume": True, "retries": 0},
        "parallel": {"env": "local", "n_workers": n_workers, "num_shards": num_shards},
    }
    cfg.update(extra)
    return cfg


@pytest.fixture
def fsdd_dir():
    if not FSDD.is_dir():
        pytest.skip(f"real recordings not present at {FSDD} (only beside the project in CI and dev)")
    return FSDD
