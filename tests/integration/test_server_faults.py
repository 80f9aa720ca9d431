"""The Prefect server a run reports to dies mid-run: the run ends within seconds on one line naming the
server and the command that finishes it; a plain re-run does only what is missing
(espnet3_prefect/server/watch.py; docs/reliability.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env, start_infer
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow
EXPECTED = lambda n: "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(n))  # noqa: E731
N_ITEMS, N_SHARDS = 120, 24


def _slow_toy(tmp_path, **parallel):
    cfg = toy_config(tmp_path, n=N_ITEMS, num_shards=N_SHARDS)
    cfg["model"]["sleep_s"] = 0.1  # ~0.5 s per shard: the run lasts ~6 s on 2 workers
    cfg["parallel"].update(parallel)
    return write_yaml(tmp_path / "inference.yaml", cfg)


def _start_cli(path, tmp_path, env, sigint):
    """The CLI as a terminal starts it (``sigint`` SIG_DFL) or as ``nohup ... &`` does (SIG_IGN,
    inherited and kept by Python): the watch ends the run the same way in both."""
    return start_infer(path, tmp_path, env, preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))


def _wait_for_done(out, n: int, proc, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(list(out.glob("split.*/done"))) < n and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the fault"


def _ends_on_the_line(proc, killed_at: float, server: str, how: str = r"stopped \(connection refused\) mid-run"):
    _, stderr = proc.communicate(timeout=120)
    ended_s = time.monotonic() - killed_at
    last = stderr.rstrip().splitlines()[-1]
    assert proc.returncode == 1, stderr[-3000:]
    assert re.fullmatch(
        rf"error: {server} at http://127\.0\.0\.1:\d+/api {how}; the shards "
        r"finished so far are kept on disk; to finish the rest, re-run: espnet3-prefect infer --config \S+",
        last,
    ), last
    assert "Finished in state Running" not in stderr, stderr[-3000:]
    return ended_s, stderr


def _rerun_finishes(path, tmp_path, env, done_before: set[int]) -> None:
    (tmp_path / "forward.log").unlink()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "inference/test_a/y.scp").read_text() == EXPECTED(N_ITEMS)
    per_shard = N_ITEMS // N_SHARDS
    rerun = {int(line.split()[1]) // per_shard for line in read_lines(tmp_path / "forward.log")}
    assert not rerun & done_before, sorted(rerun & done_before)  # a shard marked done is never decoded again


def test_the_embedded_server_killed_mid_run_ends_the_run_on_one_line(tmp_path):
    path = _slow_toy(tmp_path)
    env = cli_env(tmp_path / "home")
    proc = _start_cli(path, tmp_path, env, signal.SIG_DFL)
    out = tmp_path / "inference/test_a"
    _wait_for_done(out, 2, proc)
    server = json.loads((tmp_path / "home/server.json").read_text())
    os.killpg(server["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    ended_s, _ = _ends_on_the_line(proc, killed_at, rf"the run's Prefect server \(pid {server['pid']}\)")
    assert ended_s < 60, ended_s  # within seconds (~15 s on 2 loaded cores), not Prefect's minutes of retries
    done = {int(p.parent.name.split(".")[1]) for p in out.glob("split.*/done")}
    assert 2 <= len(done) < N_SHARDS, done
    _rerun_finishes(path, tmp_path, env, done)


def test_a_users_own_server_gone_longer_than_api_outage_s_ends_the_run_on_one_line(tmp_path):
    """A server that is not the run's own is waited for (tests/integration/test_server_outage.py), up to
    ``parallel.api_outage_s``: past it, the run ends on the same one line, and a re-run finishes."""
    from espnet3_prefect.server.process import start_server, stop_server
    from tests.helpers.prefect_db import seed

    home = seed(tmp_path / "users-server")
    server, url = start_server(home, ui=False)
    try:
        path = _slow_toy(tmp_path, api_outage_s=5)
        env = {**cli_env(tmp_path / "home"), "PREFECT_API_URL": url}
        proc = _start_cli(path, tmp_path, env, signal.SIG_IGN)
        out = tmp_path / "inference/test_a"
        _wait_for_done(out, 2, proc)
        os.killpg(server.pid, signal.SIGKILL)
        how = r"has been unreachable since \d\d:\d\d:\d\d \(connection refused\), longer than parallel.api_outage_s=5"
        _, stderr = _ends_on_the_line(proc, time.monotonic(), "the Prefect server of PREFECT_API_URL", how)
        assert stderr.count("is unreachable since") == 1, stderr[-3000:]
        server.wait(30)
        done_before = {int(p.parent.name.split(".")[1]) for p in out.glob("split.*/done")}
        note = tmp_path / "inference/.espnet3-prefect.unreported.json"
        first_run = json.loads(note.read_text())["flow_run_id"]  # what it could not report, for the next run
        server, url = start_server(home, ui=False, port=int(url.rsplit(":", 1)[1].split("/")[0]))
        _rerun_finishes(path, tmp_path, env, done_before)
        assert not note.exists()
        # the re-run ended the first run's record: Crashed, with every shard it finished Completed in it
        run = _post(url, f"flow_runs/{first_run}", None)
        assert run["state_type"] == "CRASHED" and "without its Prefect server" in run["state"]["message"], run["state"]
        deadline = time.monotonic() + 30
        while True:
            shards = _post(url, "task_runs/filter", {"flow_runs": {"id": {"any_": [first_run]}}, "limit": 200})
            completed = {t["name"] for t in shards if t["state_type"] == "COMPLETED" and "test_a-" in t["name"]}
            if len(completed) >= len(done_before) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(completed) >= len(done_before), (sorted(completed), sorted(done_before))
    finally:
        stop_server(server.pid)


def _post(api_url: str, path: str, body: dict | None):
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{api_url}/{path}", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)


class _Health:
    """A loopback ``/health`` that answers until :meth:`close`: the listening socket goes with it."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_watch_interrupts_a_blocked_main_thread_once_the_server_is_gone():
    from espnet3_prefect.server import watch

    health = _Health()
    with pytest.raises(watch.ServerGoneError, match=r"the test's server at .* stopped .*re-run: run it again$"):
        with watch.watching(health.url, what="the test's server", rerun="run it again") as w:
            w.interval_s = 0.1
            time.sleep(0.5)  # answered: nothing happens
            health.close()
            threading.Event().wait(60)  # a blocked wait, as the flow's as_completed: woken by the signal
    assert w.reason.startswith("the test's server at ")
    # the next run of this process starts with a clean slate: a watch's verdict is its own
    health = _Health()
    try:
        with watch.watching(health.url, what="the next server") as later:
            assert later.reason is None
    finally:
        health.close()


def test_the_probe_tells_a_refused_connection_from_an_answer():
    from espnet3_prefect.server.watch import probe

    assert probe("http://127.0.0.1:9/api", timeout_s=1, cafile=None) == "refused"  # nothing listens on 9
    health = _Health()
    try:
        assert probe(health.url, timeout_s=1, cafile=None) == "up"
    finally:
        health.close()


def test_the_watch_interrupts_under_a_handler_that_exits_silently_and_puts_it_back():
    """dask_jobqueue's import installs ``lambda *_: sys.exit()`` for SIGINT (a test run once had it
    from an earlier test in the same process, and the watch's interrupt became a SystemExit). The
    watch's own interrupt is its own; the handler that was there is back after the block."""
    import signal
    import sys

    from espnet3_prefect.server import watch

    def exits_silently(*_):
        sys.exit()

    saved = signal.signal(signal.SIGINT, exits_silently)
    try:
        health = _Health()
        with pytest.raises(watch.ServerGoneError, match=r"the test's server at .* stopped"):
            with watch.watching(health.url, what="the test's server") as w:
                w.interval_s = 0.1
                health.close()
                threading.Event().wait(60)
        assert signal.getsignal(signal.SIGINT) is exits_silently
        # a Ctrl-C that is not the watch's still reaches the handler that was there
        health = _Health()
        try:
            with pytest.raises(SystemExit):
                with watch.watching(health.url, what="the test's server"):
                    signal.raise_signal(signal.SIGINT)
        finally:
            health.close()
        assert signal.getsignal(signal.SIGINT) is exits_silently
    finally:
        signal.signal(signal.SIGINT, saved)


class _Switch:
    """A loopback ``/health`` on one port that answers 200, answers ``status``, or is closed, as told."""

    def __init__(self):
        from espnet3_prefect.server.process import free_port

        self.port, self.status, self._server = free_port(), 200, None
        self.url = f"http://127.0.0.1:{self.port}"
        self.open()

    def open(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        switch = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(switch.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _until(predicate, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_a_server_not_the_runs_own_is_waited_for_said_once_gone_and_once_back(caplog):
    from espnet3_prefect.execution import api_reach
    from espnet3_prefect.server import watch

    switch = _Switch()
    try:
        with watch.watching(switch.url, what="the lab's server", outage_s=60) as w:
            w.interval_s = 0.05
            assert api_reach.current() is w and api_reach.wait_until_up(0.1)
            switch.close()
            _until(api_reach.server_out)
            waiter = threading.Thread(target=lambda: setattr(waiter, "up", api_reach.wait_until_up(30)))
            waiter.start()
            time.sleep(0.3)
            assert waiter.is_alive()  # blocked while the server is out
            switch.open()
            waiter.join(30)
            assert waiter.up and not api_reach.server_out()
            assert w.reason is None and api_reach.outages_begun() == 1 and len(w.outages) == 1
        assert api_reach.current() is None
    finally:
        switch.close()
    said = [r.getMessage() for r in caplog.records if r.name == "espnet3_prefect"]
    assert sum("is unreachable since" in m and "(connection refused)" in m for m in said) == 1, said
    assert sum("answers again" in m for m in said) == 1, said


def test_a_server_busy_past_api_outage_s_ends_the_run_naming_it_busy():
    from espnet3_prefect.server import watch

    switch = _Switch()
    try:
        switch.status = 503
        with pytest.raises(
            watch.ServerGoneError,
            match=r"has been busy since \S+ \(it answers 503 or 429\), longer than parallel\.api_outage_s=1;",
        ):
            with watch.watching(switch.url, what="the lab's server", outage_s=1) as w:
                w.interval_s = 0.05
                threading.Event().wait(60)  # woken by the watch's interrupt
        # the run's own server answering 503 is there: busy, not gone
        with watch.watching(switch.url, what="the run's server") as own:
            own.interval_s = 0.05
            time.sleep(0.5)
            assert own.reason is None and own.out_since is None
    finally:
        switch.close()


def test_api_outage_s_is_checked_before_anything_starts():
    from espnet3_prefect.errors import ConfigError
    from espnet3_prefect.execution.spec import ParallelSpec

    assert ParallelSpec.from_config({}).api_outage_s == 900.0
    assert ParallelSpec.from_config({"api_outage_s": None}).api_outage_s is None
    assert ParallelSpec.from_config({"address": "tcp://h:8786", "api_outage_s": 30}).api_outage_s == 30.0
    for bad in (0, -1, "15m", True, float("inf")):
        with pytest.raises(ConfigError, match=r"^parallel\.api_outage_s: must be a number of seconds > 0"):
            ParallelSpec.from_config({"api_outage_s": bad})
