"""The servers we leave running can be found and stopped; the default state dir is per project.

No Prefect server here: stand-in processes (``sleep`` under a name with "prefect" in it) play the
servers, so the tests run in a second. Real servers: tests/integration/test_server_ui.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from espnet3_prefect._internal.proc import descendants, pid_alive, stop_tree
from espnet3_prefect.server import process, state_home
from espnet3_prefect.server.registry import (
    ServerRecord,
    find_servers,
    format_servers,
    kept_server_message,
    list_servers,
    stop_servers,
)

# A stand-in that looks like a server to list_servers (its command line says "prefect").
FAKE_SERVER = [sys.executable, "-c", "import time; time.sleep(120)", "prefect", "server", "start"]


@pytest.fixture
def registry(tmp_path, monkeypatch):
    reg = tmp_path / "registry"
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(reg))
    return reg


@pytest.fixture
def spawn():
    """Start processes in their own session (as start_server does); every one is stopped after."""
    procs: list[subprocess.Popen] = []

    def start(cmd=FAKE_SERVER) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def fake_server(spawn, home: Path, port: int) -> subprocess.Popen:
    proc = spawn()
    home.mkdir(parents=True, exist_ok=True)
    process._register(proc.pid, f"http://127.0.0.1:{port}/api", home, True)
    (home / "server.json").write_text(json.dumps({"pid": proc.pid, "api_url": f"http://127.0.0.1:{port}/api"}))
    return proc


def gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            pass
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


# -- per-project state dir ---------------------------------------------------------------------


def test_default_state_dir_is_per_project_in_the_git_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("ESPNET3_PREFECT_HOME", raising=False)
    project_a, project_b = tmp_path / "a", tmp_path / "b"
    (project_a / ".git").mkdir(parents=True)
    (project_b / "recipes/x").mkdir(parents=True)
    (project_b / ".git").write_text("gitdir: /elsewhere/worktrees/b\n")  # a worktree: .git is a file
    monkeypatch.chdir(project_a)
    assert state_home.default_state_dir() == project_a.resolve() / ".e3p/prefect" and not (project_a / ".e3p").exists()
    assert state_home.state_dir() == project_a.resolve() / ".e3p/prefect"
    monkeypatch.chdir(project_b / "recipes/x")  # run from a recipe folder: still the checkout's
    home_b = state_home.state_dir()
    assert home_b == project_b.resolve() / ".e3p/prefect" and home_b.is_dir()
    assert (project_b / ".e3p/.gitignore").read_text().splitlines()[-1] == "*"  # never untracked noise


def test_default_state_dir_outside_git_is_the_current_folder_and_overrides_win(tmp_path, monkeypatch):
    monkeypatch.delenv("ESPNET3_PREFECT_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    if state_home.project_folder() != tmp_path.resolve():
        pytest.skip("the temp folder is inside a git checkout here")
    assert state_home.state_dir() == tmp_path.resolve() / ".e3p/prefect"
    monkeypatch.setenv("ESPNET3_PREFECT_HOME", str(tmp_path / "env-home"))
    assert state_home.state_dir() == (tmp_path / "env-home").resolve()
    assert state_home.state_dir(tmp_path / "arg") == (tmp_path / "arg").resolve()  # --state-dir beats the env


def test_an_existing_gitignore_in_e3p_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("ESPNET3_PREFECT_HOME", raising=False)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".e3p").mkdir()
    (tmp_path / ".e3p/.gitignore").write_text("prefect/\n")
    monkeypatch.chdir(tmp_path)
    state_home.state_dir()
    assert (tmp_path / ".e3p/.gitignore").read_text() == "prefect/\n"


# -- list / find / stop --------------------------------------------------------------------------


def test_list_servers_shows_running_ones_and_drops_records_of_dead_or_recycled_pids(tmp_path, registry, spawn):
    a = fake_server(spawn, tmp_path / "a", 40001)
    b = fake_server(spawn, tmp_path / "b", 40002)
    dead = spawn()
    dead.kill()
    dead.wait()
    process._register(dead.pid, "http://127.0.0.1:40003/api", tmp_path / "c", True)
    recycled = spawn(["sleep", "120"])  # alive, but not the process recorded: a pid reused
    process._register(recycled.pid, "http://127.0.0.1:40004/api", tmp_path / "d", True)
    path = registry / f"{recycled.pid}.json"
    data = json.loads(path.read_text())
    assert isinstance(data["create_time"], float)  # the recorded process's own start
    path.write_text(json.dumps({**data, "create_time": data["create_time"] - 3600}))  # another's, an hour before
    (registry / "junk.json").write_text("{not json")
    found = list_servers()
    assert [s.pid for s in found] == sorted([a.pid, b.pid], key=lambda p: (found[0].started, p))
    assert {s.state_dir for s in found} == {str(tmp_path / "a"), str(tmp_path / "b")}
    rec = next(s for s in found if s.pid == a.pid)
    assert rec.api_url == "http://127.0.0.1:40001/api" and rec.ui_url == "http://127.0.0.1:40001"
    assert rec.started[:4].isdigit() and "T" in rec.started and rec.worker_pid is None
    assert not (registry / f"{dead.pid}.json").exists() and not (registry / f"{recycled.pid}.json").exists()
    assert (registry / "junk.json").exists()  # not ours to judge


def test_find_servers_by_pid_any_url_on_it_state_dir_or_all(tmp_path, registry, spawn):
    a = fake_server(spawn, tmp_path / "a", 40011)
    b = fake_server(spawn, tmp_path / "b", 40012)
    pids = lambda target: sorted(s.pid for s in find_servers(target))  # noqa: E731
    assert pids(str(a.pid)) == [a.pid]
    assert pids("http://127.0.0.1:40012") == [b.pid]
    assert pids("http://127.0.0.1:40012/api") == [b.pid]
    assert pids("http://127.0.0.1:40011/runs/flow-run/0b7f5c2e-0000-4000-8000-000000000000") == [a.pid]
    assert pids("localhost:40011") == [a.pid]
    assert pids(str(tmp_path / "b")) == [b.pid]
    assert pids("all") == sorted([a.pid, b.pid])
    assert pids("http://127.0.0.1:4200") == [] and pids("999999999") == []


def test_stop_servers_stops_the_named_one_and_cleans_its_records(tmp_path, registry, spawn):
    a = fake_server(spawn, tmp_path / "a", 40021)
    b = fake_server(spawn, tmp_path / "b", 40022)
    (tmp_path / "a/users").mkdir()
    (tmp_path / "a/users" / str(a.pid)).touch()
    outcome = stop_servers("http://127.0.0.1:40021")
    assert [s.pid for s in outcome.stopped] == [a.pid] and outcome.busy == []
    assert gone(a.pid) and pid_alive(b.pid)
    assert not (registry / f"{a.pid}.json").exists() and (registry / f"{b.pid}.json").exists()
    assert not (tmp_path / "a/server.json").exists() and not (tmp_path / "a/users" / str(a.pid)).exists()
    assert (tmp_path / "b/server.json").exists()
    assert [s.pid for s in stop_servers("all").stopped] == [b.pid] and gone(b.pid)
    assert list_servers() == []


def test_a_server_in_use_by_a_run_is_left_running_unless_forced(tmp_path, registry, spawn):
    a = fake_server(spawn, tmp_path / "a", 40031)
    run = spawn(["sleep", "120"])  # an espnet3-prefect run using that server
    (tmp_path / "a/users").mkdir()
    (tmp_path / "a/users" / str(run.pid)).touch()
    [rec] = list_servers()
    assert rec.users() == [run.pid] and f"in use by pid {run.pid}" in format_servers([rec])
    outcome = stop_servers("all")
    assert outcome.stopped == [] and [s.pid for s in outcome.busy] == [a.pid] and pid_alive(a.pid)
    assert [s.pid for s in stop_servers("all", force=True).stopped] == [a.pid] and gone(a.pid)


def test_deploy_local_server_is_stopped_with_its_worker_and_the_runs_it_started(tmp_path, registry, spawn):
    a = fake_server(spawn, tmp_path / "a", 40041)
    # The worker starts each flow run in its own session: a grandchild outside the worker's group.
    worker = spawn(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(['sleep', '120'], start_new_session=True);time.sleep(120)",
        ]
    )
    deadline = time.monotonic() + 10
    while not (runs := [p for p in descendants(worker.pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs, "the stand-in worker did not start its flow run"
    (tmp_path / "a/deploy-local.json").write_text(json.dumps({"server_pid": a.pid, "worker_pid": worker.pid}))
    [rec] = list_servers()
    assert rec.worker_pid == worker.pid and f"deploy-local, worker pid {worker.pid}" in format_servers([rec])
    assert [s.pid for s in stop_servers(str(a.pid)).stopped] == [a.pid]
    assert gone(a.pid) and gone(worker.pid) and all(gone(p) for p in runs)
    assert not (tmp_path / "a/deploy-local.json").exists()


def test_stop_process_tree_of_a_process_that_leads_no_group(spawn):
    parent = spawn(
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"]
    )
    deadline = time.monotonic() + 10
    while not descendants(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    [child] = descendants(parent.pid)
    # Its child is in the group of `parent`; stopping the child alone (not a group leader) still works.
    assert stop_tree(child, timeout_s=5) and gone(child) and pid_alive(parent.pid)
    assert stop_tree(child) is False


def test_messages_for_a_kept_server_and_the_listing(tmp_path, registry):
    rec = ServerRecord(
        pid=4242, api_url="http://127.0.0.1:40123/api", started="2026-11-23T10:40:12+00:00", state_dir="/p/.e3p/prefect"
    )
    assert kept_server_message(rec) == (
        "Prefect server left running (pid 4242, state /p/.e3p/prefect):\n"
        "  UI:   http://127.0.0.1:40123\n"
        "  stop: espnet3-prefect servers --stop http://127.0.0.1:40123"
    )
    table = format_servers([rec]).splitlines()
    assert table[0].split() == ["PID", "UI", "STARTED", "STATE", "DIR"]
    assert table[1].split() == ["4242", "http://127.0.0.1:40123", "2026-11-23", "10:40:12", "/p/.e3p/prefect"]
    assert table[-1].startswith("stop one: espnet3-prefect servers --stop")
    assert format_servers([]) == f"no espnet3-prefect Prefect server is running (records: {registry})"


def test_registry_default_follows_xdg_state_home(tmp_path, monkeypatch):
    monkeypatch.delenv("ESPNET3_PREFECT_REGISTRY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert state_home.registry_dir() == tmp_path / "state/espnet3-prefect/servers"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state_home.registry_dir() == Path(os.path.expanduser("~/.local/state/espnet3-prefect/servers"))
