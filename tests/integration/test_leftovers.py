"""Nothing outlives the driver that started it, and stops do not wait to kill.

A driver (``espnet3-prefect infer`` with its embedded server) SIGKILLed mid-run: its server, the
server's guard, the fork server and the Dask workers are all gone within seconds, by pid, and a plain
re-run completes. Two runs sharing one embedded server: the first killed, the server stays for the
second, and goes once the second is killed too. ``deploy-local --stop`` with a flow run in progress
ends the worker, the flow run's processes and the server in a few seconds (the bound is checked by
:func:`tests.helpers.procs.deploy_local` on every use).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from espnet3_prefect._internal.proc import descendants, running
from tests.conftest import ROOT, toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env, deploy_local, wait_for

pytestmark = pytest.mark.slow
GONE_WITHIN_S = 15  # the guard looks every 0.5 s; the server stops on SIGTERM in about a second
EXPECTED = lambda n: "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(n))  # noqa: E731


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def family_of(*pids: int) -> dict[int, str]:
    """``pids`` and all their descendants, with their command lines."""
    return {p: cmdline(p) for pid in pids for p in (pid, *descendants(pid))}


def assert_gone(family: dict[int, str], what: str) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and any(running(p) for p in family):
        time.sleep(0.2)
    left = {p: c[:160] for p, c in family.items() if running(p)}
    assert not left, f"{what}: still running {GONE_WITHIN_S} s later: {left}"


def test_a_killed_driver_leaves_no_server_guard_fork_server_or_worker_and_a_rerun_completes(tmp_path):
    cfg = toy_config(tmp_path, n=24, num_shards=6, n_workers=2)
    cfg["model"]["sleep_s"] = 0.25
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    home = tmp_path / "home"
    env = cli_env(home)
    assert not any(k.startswith("PREFECT_") for k in env)  # the embedded server, in its own state dir
    driver = subprocess.Popen(
        [*CLI, "infer", "--config", str(path)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the test's own group stays out of it; only the driver is killed
    )
    out = tmp_path / "inference/test_a"
    wait_for(lambda: list(out.glob("split.*/done")), 180, "a first shard done")
    server = json.loads((home / "server.json").read_text())
    family = family_of(driver.pid, server["pid"])
    # what there is to leave behind: the guard and the server under it, the fork server, the workers
    assert "guard.py" in family[server["pid"]] and "--parent" in family[server["pid"]]
    assert any("espnet3_prefect.server.serve" in c for c in family.values()), family
    assert any("multiprocessing.forkserver" in c for c in family.values()), family
    assert len(family) >= 5, family  # driver, guard, server, fork server, 2 workers
    driver.kill()  # SIGKILL: no finally, no atexit
    driver.wait()
    assert_gone(family, "after the driver's SIGKILL")
    # the records the run would have removed went with it
    wait_for(lambda: not (home / "server.json").exists(), 30, "server.json removed")
    assert not list((home / "registry").glob("*.json"))

    rerun = subprocess.run(
        [*CLI, "infer", "--config", str(path)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert (out / "y.scp").read_text() == EXPECTED(24)
    assert not (home / "server.json").exists() and not list((home / "registry").glob("*.json"))


USER = """
import sys, time
from pathlib import Path
from espnet3_prefect.server.embedded import prefect_api
with prefect_api(sys.argv[1]) as url:
    print(url, flush=True)
    time.sleep(600)
"""


def test_a_shared_server_stays_for_the_run_still_using_it_and_goes_when_that_one_is_killed(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home)
    users = []
    for _ in range(2):
        proc = subprocess.Popen(
            [sys.executable, "-c", USER, str(home)], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        users.append((proc, proc.stdout.readline().strip()))
    (first, url), (second, url2) = users
    assert url.startswith("http://127.0.0.1:") and url2 == url  # the second reuses the first's server
    server = json.loads((home / "server.json").read_text())
    family = family_of(server["pid"])
    assert len(family) == 2, family  # the guard and the server

    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(3)  # several of the guard's looks
    assert all(running(p) for p in family), "the server went while a run still used it"
    from espnet3_prefect.server.process import healthy

    assert healthy(url)
    listing = subprocess.run([*CLI, "servers"], env=env, capture_output=True, text=True, timeout=60)
    assert f"in use by pid {second.pid}" in listing.stdout and "left over" not in listing.stdout, listing.stdout

    second.send_signal(signal.SIGKILL)
    second.wait()
    assert_gone(family, "after the last user's SIGKILL")
    wait_for(lambda: not (home / "server.json").exists(), 30, "server.json removed")
    assert not (home / "users").exists() or not os.listdir(home / "users")


def test_servers_reports_a_run_server_its_run_left_behind(tmp_path, monkeypatch):
    """A run's own server whose run is gone and that nothing stops (one started before servers had a
    guard, or whose guard was killed): ``servers`` marks it left over, and a later run warns."""
    from espnet3_prefect.server.process import _register, free_port
    from espnet3_prefect.server.registry import report_left_over

    home = tmp_path / "home"
    env = cli_env(home)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", env["ESPNET3_PREFECT_REGISTRY"])
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "prefect"])  # "prefect" in argv
    try:
        _register(
            fake.pid, f"http://127.0.0.1:{free_port()}/api", tmp_path / "other", False, services="run", run_pid=gone
        )
        listing = subprocess.run([*CLI, "servers"], env=env, capture_output=True, text=True, timeout=60)
        assert f"left over: the run that started it (pid {gone}) is gone" in listing.stdout, listing.stdout
        assert [s.pid for s in report_left_over(skip_state_dir=home)] == [fake.pid]  # what a later run warns of
        assert report_left_over(skip_state_dir=tmp_path / "other") == []  # its own it reuses: not reported
    finally:
        fake.kill()
        fake.wait()


def test_deploy_local_stop_with_a_flow_run_in_progress_is_quick_and_leaves_nothing(tmp_path):
    prefect = str(Path(sys.executable).with_name("prefect"))
    with deploy_local(tmp_path) as (proc, state, env):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        client = {**env, "PREFECT_API_URL": state["api_url"], "PREFECT_HOME": str(tmp_path / "home/client_home")}
        run = subprocess.run(
            [prefect, "deployment", "run", "infer/local"], env=client, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stdout + run.stderr
        # the worker has started the flow run (a child in a session of its own); the helper then stops
        # everything, checks each pid of the worker's and the server's trees is gone, and the time
        wait_for(lambda: descendants(state["worker_pid"]), 120, "the worker's flow-run process")


RACER = """
import sys, time, urllib.request
from pathlib import Path
from espnet3_prefect.server.embedded import prefect_api
home, flag = sys.argv[1], Path(sys.argv[2])
with prefect_api(home) as url:
    flag.write_text(url)
    time.sleep(3)
    with urllib.request.urlopen(url + "/health", timeout=10) as answer:
        print("health", answer.status, flush=True)
"""


def test_a_run_that_arrives_while_the_last_user_stops_the_server_never_gets_the_stopped_one(tmp_path, monkeypatch):
    """Run A ends and is about to stop the project's server (no other user) as run B starts: B registers
    only once A's stop is over (the state folder's users lock), and then starts a server of its own.
    Without the lock B took A's server in that gap and A stopped it under B."""
    from espnet3_prefect.server import embedded

    home = tmp_path / "home"
    flag = tmp_path / "b-has-a-server"
    original, racer = embedded._stop, {}

    def stop_as_b_arrives(home_, info):
        racer["proc"] = subprocess.Popen(
            [sys.executable, "-c", RACER, str(home), str(flag)],
            env=cli_env(home),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 10  # B's start, its import included, is a few seconds
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        racer["b_had_a_server_before_the_stop"] = flag.exists()
        original(home_, info)

    monkeypatch.setattr(embedded, "_stop", stop_as_b_arrives)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with embedded.prefect_api(home, ui=False):
        pass
    out, err = racer["proc"].communicate(timeout=180)
    assert not racer["b_had_a_server_before_the_stop"]  # B waited for the lock
    assert racer["proc"].returncode == 0 and "health 200" in out, err[-3000:]
