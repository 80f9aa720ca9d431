"""``env: local`` workers of a flow are forked from one fork server that imported Prefect, prefect-dask
and our tasks once; they stay separate processes, see the driver's environment of now, and a user's
own preload still runs in each of them, after ours."""

from __future__ import annotations

import logging
import os
import sys
import time

import pytest
from distributed.comm.core import CommClosedError

from espnet3_prefect.execution.backends import forkserver
from espnet3_prefect.execution.cluster import open_task_runner
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.flows.workers import FORKSERVER_PRELOAD, TASK_PRELOAD
from espnet3_prefect.tasks import preload

USER_PRELOAD = """
import sys
def dask_setup(worker):
    worker.user_preload_saw = {"ours_done": hasattr(worker, "espnet3_prefect_warmed"),
                               "prefect_loaded": "prefect.task_engine" in sys.modules}
"""


def _runner(tmp_path, n_workers: int, **options):
    spec = ParallelSpec.from_config(
        {"env": "local", "n_workers": n_workers, "options": {"dashboard_address": None, **options}}
    )
    return open_task_runner(
        spec,
        log_root=tmp_path,
        logger=logging.getLogger("test"),
        worker_preload=TASK_PRELOAD,
        forkserver_preload=FORKSERVER_PRELOAD,
    )


def _state(dask_worker) -> dict:
    import prefect.settings

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "warmed": getattr(dask_worker, preload.WARMED, None),
        "loaded": [name for name in preload.MODULES if name in sys.modules],
        "user": getattr(dask_worker, "user_preload_saw", None),
        "env": {k: os.environ.get(k) for k in ("E3P_T_NEW", "E3P_T_GONE", "E3P_T_USER")},
        "api_url": prefect.settings.get_current_settings().api.url,
    }


def _set_global(value: str) -> None:
    preload.TEST_MARK = value  # a module global in this worker process only


def _get_global() -> str | None:
    return getattr(preload, "TEST_MARK", None)


@pytest.mark.slow
def test_local_workers_are_forked_from_one_warm_server_and_stay_isolated(tmp_path):
    with _runner(tmp_path, 2) as runner:
        client = runner.client
        states = client.run(_state)
        assert len(states) == 2
        pids = {s["pid"] for s in states.values()}
        parents = {s["ppid"] for s in states.values()}
        assert len(pids) == 2 and os.getpid() not in pids  # two processes of their own
        assert len(parents) == 1 and parents != {os.getpid()}  # both forked by the one fork server
        for state in states.values():
            assert state["loaded"] == list(preload.MODULES)  # imported before any task ...
            assert state["warmed"] == []  # ... by the fork server, not by the worker
        first, second = sorted(states)
        client.run(_set_global, "first", workers=[first])
        assert client.run(_get_global) == {first: "first", second: None}  # no memory shared
        client.submit(os._exit, 1, workers=[first], pure=False)  # one worker dies; the other goes on
        deadline, now = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            try:
                now = client.run(_state)
            except CommClosedError:  # asked while the dying worker was still listed: ask again
                continue
            if len(now) == 2 and first not in now:
                break
            time.sleep(0.2)
        assert len(now) == 2 and now[second]["pid"] == states[second]["pid"]
        [restarted] = [s for address, s in now.items() if address != second]
        assert restarted["pid"] not in pids and restarted["ppid"] in parents and restarted["warmed"] == []
        assert preload.__name__ and _get_global() is None  # the driver never saw the worker's global


@pytest.mark.slow
def test_a_users_preload_runs_after_ours(tmp_path, monkeypatch):
    (tmp_path / "e3p_user_preload.py").write_text(USER_PRELOAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    with _runner(tmp_path, 2, preload="e3p_user_preload") as runner:
        states = runner.client.run(_state)
    assert [s["user"] for s in states.values()] == [{"ours_done": True, "prefect_loaded": True}] * 2


@pytest.mark.slow
def test_forked_workers_get_the_drivers_environment_of_now(tmp_path, monkeypatch):
    monkeypatch.setenv("E3P_T_GONE", "old")
    with _runner(tmp_path, 1):  # the fork server runs from here on (if no earlier test started it)
        pass
    monkeypatch.delenv("E3P_T_GONE")
    monkeypatch.setenv("E3P_T_NEW", "new")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    with _runner(tmp_path, 1, env={"E3P_T_USER": "mine"}) as runner:
        [state] = runner.client.run(_state).values()
    assert state["env"] == {"E3P_T_NEW": "new", "E3P_T_GONE": None, "E3P_T_USER": "mine"}
    assert state["api_url"] == "http://127.0.0.1:9/api"  # Prefect, imported in the fork server, re-read it


def test_worker_environ_names_every_variable_it_hands_over():
    env = forkserver.worker_environ({"X": 1}, environ={"A": "a"})
    assert env[forkserver.KEYS_VAR].split(",") == sorted(env)
    assert env["X"] == "1"


DRIVER = """
import contextlib, logging, os, sys, tempfile
from pathlib import Path
from espnet3_prefect.execution.cluster import open_task_runner, start_fork_server
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.flows.workers import INFER_FORKSERVER_PRELOAD, TASK_PRELOAD

@contextlib.contextmanager
def infer_workers(spec):
    # the infer flow's local workers, forked from this process's fork server, once all are up
    with tempfile.TemporaryDirectory() as tmp, open_task_runner(
        spec, log_root=Path(tmp), logger=logging.getLogger("t"),
        worker_preload=TASK_PRELOAD, forkserver_preload=INFER_FORKSERVER_PRELOAD,
    ) as runner:
        runner.client.wait_for_workers(spec.n_workers)
        yield runner
"""

INFER_WORKERS = (
    DRIVER
    + """
def seen(dask_worker):
    return {"torch": "torch" in sys.modules, "pid": os.getpid(), "ppid": os.getppid()}

def uses_torch():
    import torch
    return float(torch.ones(3).sum())

if __name__ == "__main__":
    spec = ParallelSpec.from_config({"env": "local", "n_workers": 2, "options": {"dashboard_address": None}})
    with infer_workers(spec) as runner:
        states = list(runner.client.run(seen).values())
        print("DRIVER_TORCH", "torch" in sys.modules)
        pids, parents = {s["pid"] for s in states}, {s["ppid"] for s in states}
        print("WORKERS", sorted(s["torch"] for s in states), len(pids), len(parents))
        print("RESULT", runner.client.submit(uses_torch, pure=False).result())
"""
)


@pytest.mark.slow
def test_infer_workers_fork_with_torch_imported_once_in_the_fork_server(tmp_path):
    """The infer flow's fork server imports torch (every infer worker needs it): both workers start
    with it imported before any task ran, the driver does not import it, and it works in a fork."""
    import subprocess

    script = tmp_path / "infer_workers.py"
    script.write_text(INFER_WORKERS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["DRIVER_TORCH"] == "False"  # only the fork server imported it
    assert lines["WORKERS"] == "[True, True] 2 1"  # two processes, one parent, torch already there
    assert lines["RESULT"] == "3.0"


EARLY_FORK_SERVER = (
    DRIVER
    + """
def seen(dask_worker):
    ok = sys.modules.get("stage_ok")
    return {"ok_from": getattr(ok, "IMPORTED_IN", None), "ppid": os.getppid(), "bad": "stage_bad" in sys.modules,
            "home": os.environ.get("PREFECT_HOME")}

if __name__ == "__main__":
    spec = ParallelSpec.from_config({"env": "local", "n_workers": 2, "options": {"dashboard_address": None}})
    home = sys.argv[1]
    # as a front door does it: before any Prefect API is set, beside the server's start
    started = start_fork_server(spec, INFER_FORKSERVER_PRELOAD, ("stage_bad", "stage_ok"), {"PREFECT_HOME": home})
    print("STARTED", started)
    print("DRIVER", "stage_ok" in sys.modules, "prefect" in sys.modules)
    os.environ["PREFECT_HOME"] = home + "-run"  # what the run exports once the API is set
    with infer_workers(spec) as runner:
        states = list(runner.client.run(seen).values())
        print("FROM_PARENT", sorted(s["ok_from"] == s["ppid"] for s in states), len({s["ppid"] for s in states}))
        print("BAD", sorted(s["bad"] for s in states))
        print("HOME", sorted({s["home"] == home + "-run" for s in states}))
"""
)


@pytest.mark.slow
def test_a_fork_server_started_before_the_api_imports_the_stage_modules_once(tmp_path):
    """The front doors start the fork server beside the Prefect server's start (``start_fork_server``):
    the stage's modules are imported there, once, before any worker exists (a module that fails to
    import there does not stop it: the worker imports it itself); the workers forked later take the
    driver's environment of then; Prefect's home of the fork server is the run's, not ``~/.prefect``."""
    import subprocess

    (tmp_path / "stage_ok.py").write_text("import os\nIMPORTED_IN = os.getpid()\n")
    (tmp_path / "stage_bad.py").write_text("raise RuntimeError('not importable in a fork server')\n")
    script = tmp_path / "early.py"
    script.write_text(EARLY_FORK_SERVER)
    user_home = tmp_path / "user"
    user_home.mkdir()
    env = {
        **os.environ,
        "HOME": str(user_home),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("PREFECT_HOME", None)
    env.pop("PREFECT_API_URL", None)
    home = tmp_path / "client_home"
    out = subprocess.run([sys.executable, str(script), str(home)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["STARTED"] == "True"
    assert lines["DRIVER"] == "False False"  # the driver imported neither: the fork server did
    assert lines["FROM_PARENT"] == "[True, True] 1"  # imported once, in the one parent of both workers
    assert lines["BAD"] == "[False, False]"
    assert lines["HOME"] == "[True]"  # the run's environment, handed over at the fork
    assert home.is_dir() and not (user_home / ".prefect").exists()
