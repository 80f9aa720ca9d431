"""Processes, pid reuse, interface addresses and the Redis ping through psutil and redis-py: a record
names the process it was written for (its start time), not whichever took its pid since."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from espnet3_prefect._internal.proc import CLOCK_SLACK_S, descendants, running, started_by, stop_tree
from espnet3_prefect.server import host, postgres, process
from espnet3_prefect.server.registry import list_servers

FAKE_SERVER = [sys.executable, "-c", "import time; time.sleep(120)", "prefect", "server", "start"]


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A stand-in server process (its command line says "prefect") and the registry it is recorded in."""
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    proc = subprocess.Popen(FAKE_SERVER, start_new_session=True, stdin=subprocess.DEVNULL)
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def record(tmp_path, pid: int, **fields) -> None:
    process._register(pid, "http://127.0.0.1:40101/api", tmp_path / "home", True)
    path = tmp_path / "registry" / f"{pid}.json"
    data = json.loads(path.read_text())
    data.pop("create_time", None)  # as a record written before records held it, unless fields give one
    path.write_text(json.dumps({**data, **fields}))


def test_started_by_tells_the_recorded_process_from_one_that_took_its_pid_later():
    created = psutil.Process().create_time()
    assert started_by(os.getpid(), created) and started_by(os.getpid(), time.time())
    assert not started_by(os.getpid(), created - CLOCK_SLACK_S - 60)  # recorded before this process began
    assert not started_by(0, time.time()) and not started_by(2**22 + 1, time.time())


def test_a_record_with_the_create_time_is_kept_only_for_that_process(tmp_path, server):
    created = psutil.Process(server.pid).create_time()
    record(tmp_path, server.pid, create_time=created)
    assert [s.pid for s in list_servers()] == [server.pid]
    record(tmp_path, server.pid, create_time=created - 3600)  # the pid belonged to another process then
    assert list_servers() == [] and not (tmp_path / "registry" / f"{server.pid}.json").exists()


def test_an_older_record_without_it_is_dropped_when_written_before_the_process_started(tmp_path, server):
    record(tmp_path, server.pid, started="2020-01-01T00:00:00+00:00")
    assert list_servers() == []
    record(tmp_path, server.pid, started="not a time")  # unreadable: the command line decides, as before
    assert [s.pid for s in list_servers()] == [server.pid]


def test_stop_tree_finds_and_stops_the_descendants_and_a_zombie_is_not_running():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '120']); time.sleep(120)"],
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not descendants(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    [child] = descendants(parent.pid)
    assert stop_tree(parent.pid, timeout_s=5) is True
    assert not running(parent.pid) and not running(child)
    assert stop_tree(parent.pid) is False


def test_interface_addresses_and_an_interface_name_resolve_to_its_address():
    loopback = next(name for name, nics in psutil.net_if_addrs().items() if "127.0.0.1" in host._addresses(nics))
    assert host.resolve_host(loopback) == "127.0.0.1"
    addresses = host.interface_addresses()
    assert "127.0.0.1" in addresses and all("%" not in a for a in addresses)  # no scoped link-local IPv6


def test_stop_postgres_leaves_a_process_that_is_no_postmaster_alone():
    assert postgres.stop_postgres(os.getpid()) is False and running(os.getpid())


def test_ping_answers_only_with_the_password(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    from espnet3_prefect.server.redis import ping, start_redis

    server = start_redis(tmp_path)
    try:
        assert ping(server.host, server.port, server.password) and server.alive()
        started = time.monotonic()
        assert not ping(server.host, server.port, "wrong")
        assert time.monotonic() - started < 2  # refused at once, not retried
    finally:
        server.stop()
    assert not ping(server.host, server.port, server.password)
