"""One process's stop (a first signal, a wait, SIGKILL: :func:`stop_process`) on real processes, as
stop_group, the server's guard and stop_postgres use it; and the server stop timeouts in their order."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from espnet3_prefect._internal.proc import stop_group
from espnet3_prefect._internal.stopping import SERVER_STOP, ServerStopTimeouts, stop_process, wait_gone
from espnet3_prefect.server import guard, postgres, process, serve

#: exits on SIGTERM (saying so first); else sleeps for two minutes
EXITS_ON_TERM = (
    "import signal, sys, time\n"
    "def term(*_): print('term', flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)
#: says it got SIGTERM and runs on: only SIGKILL ends it (or two minutes)
IGNORES_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"  # goes on after the handler (PEP 475)
)
#: ignores SIGTERM and starts a child in its own process group that ignores it too; prints that child's pid
LEADER = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "code = 'import signal, time; signal.signal(15, signal.SIG_IGN); print(1, flush=True); time.sleep(120)'\n"
    "child = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
    "child.stdout.readline()\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def spawn():
    """Start ``python -c CODE`` and wait for its first line (its handlers are set by then); every
    process started is killed after the test should the test have left it."""
    started: list[psutil.Process] = []
    children: list[subprocess.Popen] = []

    def start(code: str, new_session: bool = True, cwd=None) -> tuple[subprocess.Popen, str]:
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=new_session,
            cwd=cwd,
        )
        started.append(psutil.Process(child.pid))
        children.append(child)
        return child, child.stdout.readline().strip()

    start.track = started.append  # a process one of them started
    yield start
    for proc in started:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    wait_gone(started, 10)
    for child in children:
        child.stdout.close()
        child.poll()  # reaped already: Popen learns it is over


def gone(pid: int) -> bool:
    """Nothing of ``pid`` is left: not even a zombie (a child of ours is reaped by the stop). Asked
    before its output is read to the end, which would wait for a process that still runs."""
    return not psutil.pid_exists(pid)


def test_a_process_that_exits_on_sigterm_is_stopped_without_sigkill(spawn):
    child, ready = spawn(EXITS_ON_TERM)
    assert ready == "ready"
    started = time.monotonic()
    assert stop_process(child.pid, 60) is True
    assert time.monotonic() - started < 60  # SIGKILL would have come only after the 60 s
    assert gone(child.pid) and child.stdout.read().split() == ["term"]


def test_a_process_that_ignores_sigterm_is_killed_after_the_wait(spawn):
    child, _ = spawn(IGNORES_TERM)
    started = time.monotonic()
    assert stop_process(child.pid, 0.5) is True
    assert time.monotonic() - started >= 0.5  # it was given the wait first
    assert gone(child.pid) and child.stdout.read().split() == ["term"]  # told, then killed


def test_no_first_signal_means_sigkill_after_the_wait(spawn):
    child, _ = spawn(EXITS_ON_TERM)
    assert stop_process(psutil.Process(child.pid), 0.2, first=None) is True
    assert gone(child.pid) and child.stdout.read() == ""  # no SIGTERM came: SIGKILL ended it


def test_a_group_is_killed_whole_and_a_process_that_leads_none_alone(spawn):
    leader, grandchild = spawn(LEADER)
    grandchild = psutil.Process(int(grandchild))
    spawn.track(grandchild)
    assert stop_group(leader.pid, 0.5) is True
    assert gone(leader.pid) and wait_gone([grandchild], 10) == []  # SIGKILL reached the whole group
    member, _ = spawn(IGNORES_TERM, new_session=False)  # in our own group: signalled alone, we live on
    assert stop_process(member.pid, 0.2, group=True) is True and gone(member.pid)


def test_a_process_gone_already_counts_as_stopped_and_pid_0_is_refused(spawn):
    child, _ = spawn(EXITS_ON_TERM)
    proc = psutil.Process(child.pid)
    proc.kill()
    assert wait_gone([proc], 10) == []
    assert stop_process(proc, 1) is True
    with pytest.raises(ValueError, match="not a process id"):
        stop_process(0, 1)  # os.killpg(0) would be our own group


def test_the_guard_stops_its_server_with_the_same_stop(spawn):
    server, _ = spawn(IGNORES_TERM)
    assert guard.stop(server, grace_s=0.5) == 0
    assert gone(server.pid) and server.stdout.read().split() == ["term"]


def test_the_guard_as_a_script_loads_the_stop_without_the_package():
    code = (
        "import runpy, sys\n"
        "sys.argv = [sys.argv[1], '--help']\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('espnet3_prefect', 'prefect')))\n"
        "print(sys.modules['espnet3_prefect_guard_stopping'].SERVER_STOP.guard_grace_s)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code, guard.__file__], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines()[-2:] == ["[]", str(SERVER_STOP.guard_grace_s)]


def fake_postmaster(tmp_path, monkeypatch, spawn) -> subprocess.Popen:
    """A process that ignores SIGTERM and SIGINT in a data dir whose ``postmaster.pid`` names it, and a
    ``pg_ctl`` that fails: stop_postgres has only its SIGKILL left."""
    data, bins = tmp_path / "data", tmp_path / "bin"
    data.mkdir()
    bins.mkdir()
    (bins / "pg_ctl").write_text("#!/bin/sh\nexit 1\n")
    (bins / "pg_ctl").chmod(0o755)
    monkeypatch.setattr(postgres, "bin_dir", lambda: bins)
    monkeypatch.setattr(postgres, "_run_as", lambda: None)
    child, _ = spawn("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" + IGNORES_TERM, cwd=data)
    started = int(psutil.Process(child.pid).create_time())
    lines = [str(child.pid), str(data), str(started), "5432", "", "127.0.0.1", "0 0", "ready"]
    (data / "postmaster.pid").write_text("\n".join(lines) + "\n")
    return child


def test_stop_postgres_kills_a_postmaster_pg_ctl_could_not_stop(tmp_path, monkeypatch, spawn):
    child = fake_postmaster(tmp_path, monkeypatch, spawn)
    assert postgres.stop_postgres(child.pid) is True and gone(child.pid)
    assert postgres.stop_postgres(child.pid) is False  # gone: nothing to stop


def test_stop_postgres_raises_when_the_postmaster_outlives_sigkill(tmp_path, monkeypatch, spawn):
    child = fake_postmaster(tmp_path, monkeypatch, spawn)
    monkeypatch.setattr(postgres, "stop_process", lambda *args, **kwargs: False)  # as if stuck in the kernel
    with pytest.raises(postgres.PostgresError, match=f"pid {child.pid}.*still runs after SIGKILL"):
        postgres.stop_postgres(child.pid)


def test_the_server_stop_timeouts_are_ordered_and_read_from_one_place(monkeypatch):
    assert 0 <= SERVER_STOP.drain_s < SERVER_STOP.guard_grace_s < SERVER_STOP.stop_s
    assert serve.DRAIN_TIMEOUT_S == SERVER_STOP.drain_s == serve.drain_timeout_s({})
    assert guard.GRACE_S == SERVER_STOP.guard_grace_s
    assert process.STOP_TIMEOUT_S == SERVER_STOP.stop_s
    assert serve.drain_timeout_s({serve.DRAIN_VAR: "3"}) == 3.0  # the environment still overrides it


@pytest.mark.parametrize(
    "changed",
    [
        {"drain_s": SERVER_STOP.guard_grace_s},
        {"guard_grace_s": SERVER_STOP.stop_s + 1},
        {"stop_s": 1.0},
        {"drain_s": -1},
    ],
)
def test_server_stop_timeouts_out_of_order_are_refused(changed):
    with pytest.raises(ValueError, match="out of order"):
        ServerStopTimeouts(**changed)
