"""The Prefect API served beyond loopback, over HTTPS with basic auth (docs/security.md), for real.

* The command line serves its embedded server on a non-loopback address: HTTPS and auth turn on; plain
  HTTP gets no answer, HTTPS without the run's certificate fails verification, with it but without the
  credential gets 401, with both 200 (the UI too); the run's workers record their task runs with both,
  and neither the credential nor the server key's PEM body is in the CLI output, the server log, the
  flow-run parameters or logs, any process command line; the certificate folder goes with the server.
* SLURM and Grid Engine workers (tests/infra) get the credential from the 0600 client file: their task
  runs are recorded, and the credential is in neither ``cluster-script``, the job script the scheduler
  holds, ``scontrol show job``/``qstat -j``, the job logs nor any command line during the run; a client
  file the compute node cannot read fails the run with one line naming it.
* A Dask worker in its own network namespace (its own address, over a veth pair) reaches the server and
  the scheduler on the host side and records the shards it ran (skipped where ``ip netns add`` is refused);
  from the namespace, the same four requests get the same answers.
* The batch and ssh workers reach it over HTTPS too; the key is in no job script or queue listing.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from espnet3_prefect.disk.client_file import client_file, read_client_file
from espnet3_prefect.server.host import resolve_host
from tests.conftest import ROOT, toy_config, write_yaml
from tests.helpers.https_api import assert_only_both_get_in, key_lines, probe
from tests.helpers.postgres import DATABASES
from tests.helpers.procs import CLI, cli_env, copy_project, wait_for
from tests.integration.test_real_backends import batch_parallel, queue_jobs, sge, slurm, sshd  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


def non_loopback_address() -> str:
    """An IPv4 address of this machine other than loopback (the compute nodes' way in); skip without one."""
    import socket

    for _index, name in socket.if_nameindex():
        if name == "lo":
            continue
        try:
            address = resolve_host(name)
        except Exception:
            continue
        if not address.startswith("127."):
            return address
    pytest.skip("this machine has no non-loopback IPv4 address")


class Watch(threading.Thread):
    """Every command line on this machine, the starting environment of every Dask process started
    by ``dask_spec`` (an ssh worker or scheduler), and what ``probe()`` returns, sampled until stopped.

    An ssh worker's ``VAR=value python ...`` prefix is on the command line only of the short-lived
    shell that execs python; the worker process itself shows it in its environment."""

    def __init__(self, probe=None, every_s: float = 0.3):
        super().__init__(daemon=True)
        self.cmdlines: set[str] = set()
        self.dask_spec_environs: list[dict[str, str]] = []
        self.probed: list[str] = []
        self.probe, self.every_s, self._halt = probe, every_s, threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for entry in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    cmdline = entry.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.cmdlines.add(cmdline)
                    if "distributed.cli.dask_spec" in cmdline:
                        pairs = (entry.parent / "environ").read_bytes().decode(errors="replace").split("\0")
                        self.dask_spec_environs.append(dict(p.split("=", 1) for p in pairs if "=" in p))
                except OSError:
                    pass
            if self.probe is not None:
                try:
                    self.probed.extend(self.probe())
                except Exception as exc:  # a job that left between listing and asking
                    self.probed.append(f"probe failed: {exc}")
            self._halt.wait(self.every_s)

    def stop(self) -> Watch:
        self._halt.set()
        self.join(30)
        return self


def status_of(api_url: str, auth_string: str | None, cafile: str | None = None) -> int:
    """The HTTP status of a POST /flow_runs/filter, with basic auth when ``auth_string`` (``https://``:
    verified with ``cafile``)."""
    import ssl

    request = urllib.request.Request(
        f"{api_url}/flow_runs/filter", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    if auth_string:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    context = ssl.create_default_context(cafile=cafile) if api_url.startswith("https://") else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def recorded(creds) -> dict:
    """What the authed API holds: task runs (name -> state), and the flow runs' parameters and logs as text."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with creds.sync_client() as client:
        flow_runs = client.read_flow_runs()
        tasks = {t.name: t.state_type.value for t in client.read_task_runs()}
        ids = [f.id for f in flow_runs]
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids))) if ids else []
    return {
        "tasks": tasks,
        "parameters": json.dumps([f.parameters for f in flow_runs], default=str),
        "logs": "\n".join(log.message for log in logs),
    }


def texts_under(*folders: Path) -> dict[str, str]:
    """Every readable file under ``folders`` except the client files and the server database."""
    found = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if (
                path.is_file()
                and not path.name.startswith(("api-client", ".api-client"))
                and "prefect_home" not in path.parts
                and "api-tls" not in path.parts
            ):
                found[str(path)] = path.read_text(errors="replace")
    return found


def assert_nowhere(secret: str | list[str], **places) -> None:
    """No ``secret`` (the credential, or each line of a key's PEM body) in any of ``places``."""
    secrets = [secret] if isinstance(secret, str) else secret
    assert secrets and all(secrets)
    for name, text in places.items():
        blob = (
            "\n".join(text)
            if isinstance(text, (set, list, tuple))
            else ("\n".join(f"{k}\n{v}" for k, v in text.items()) if isinstance(text, dict) else str(text))
        )
        assert blob, f"nothing collected for {name}"
        for one in secrets:
            assert one not in blob, f"the {'credential' if isinstance(secret, str) else 'server key'} appears in {name}"


def tls_files(home: Path) -> dict:
    """The server's certificate folder, checked private; its key's PEM body lines."""
    folder = home / "api-tls"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in folder.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in folder.iterdir())
    return {"folder": folder, "ca": str(folder / "ca.pem"), "key_lines": key_lines(folder / "key.pem")}


def ui_settings(ui_url: str, creds) -> dict:
    """The UI's ``/ui-settings`` over HTTPS (where the browser's UI finds its API)."""
    import ssl

    request = urllib.request.Request(
        f"{ui_url}/ui-settings",
        headers={"Authorization": "Basic " + base64.b64encode(creds.auth_string.encode()).decode()},
    )
    context = ssl.create_default_context(cafile=creds.ssl_cert_file)
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return json.loads(response.read())


def test_cli_serves_beyond_loopback_over_https_with_auth(tmp_path):
    address = non_loopback_address()
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=8, num_shards=2))
    home = tmp_path / "home"
    refused = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "--server-host", address, "--no-server-auth"],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert refused.returncode == 2 and refused.stderr.startswith(
        f"error: refusing to serve the Prefect API on {address} without auth"
    ), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (home / "server.json").exists()

    watch = Watch()
    watch.start()
    try:
        proc = subprocess.run(
            [*CLI, "infer", "--config", str(cfg), "--server-host", address, "--keep-server"],
            env=cli_env(home),
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
        )
        watch.stop()
        assert proc.returncode == 0, proc.stderr[-3000:]
        info = json.loads((home / "server.json").read_text())
        creds = read_client_file(client_file(home))
        tls = tls_files(home)
        assert oct((home / "api-client.json").stat().st_mode & 0o777) == "0o600"
        assert (
            info["auth"] is True
            and creds.api_url == info["api_url"]
            and creds.api_url.startswith(f"https://{address}:")
        )
        assert creds.ssl_cert_file == tls["ca"] == info["ssl_cert_file"]
        assert (
            f"Prefect API: {creds.api_url} (HTTPS, verified with {tls['ca']}; basic auth; credential in "
            f"{home / 'api-client.json'}, mode 0600)" in proc.stderr
        ), proc.stderr[-2000:]
        assert_only_both_get_in(probe(creds.api_url, creds.auth_string, creds.ssl_cert_file))
        assert status_of(creds.api_url, "espnet3:wrong", creds.ssl_cert_file) == 401
        assert ui_settings(info["ui_url"], creds)["api_url"] == creds.api_url  # the UI's API is https:// too
        seen = recorded(creds)
        assert (
            seen["tasks"].get("run-shard-test_a-0") == "COMPLETED"
            and seen["tasks"].get("run-shard-test_a-1") == "COMPLETED"
        )
        places = dict(
            cli_output=proc.stdout + proc.stderr,
            flow_run_parameters=seen["parameters"],
            flow_run_logs=seen["logs"],
            command_lines=watch.cmdlines,
            our_files=texts_under(home, tmp_path / "inference"),
            server_log=(home / "server.log").read_text(),
        )
        assert_nowhere(creds.auth_string, **places)
        assert_nowhere(tls["key_lines"], **places)
        secret_part = creds.auth_string.split(":", 1)[1]
        assert not any(secret_part in line for line in watch.cmdlines)
        stop = subprocess.run(
            [*CLI, "servers", "--stop", str(info["pid"])],
            env=cli_env(home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert not client_file(home).exists()  # no stale credential left behind
        assert not tls["folder"].exists()  # nor the server's key
    finally:
        from espnet3_prefect._internal.util import read_json
        from espnet3_prefect.server.process import stop_server

        kept = read_json(home / "server.json")
        if kept:
            stop_server(kept["pid"])


def test_https_is_the_users_choice_plain_beyond_loopback_or_https_on_loopback(tmp_path, monkeypatch):
    """``--no-server-tls`` beyond loopback: plain HTTP, auth still on; ``--server-tls`` on 127.0.0.1: HTTPS
    (no auth asked); what a run gets in its environment either way."""
    from espnet3_prefect.server.embedded import prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    address = non_loopback_address()
    with prefect_api(tmp_path / "plain", ui=False, host=address, tls=False) as url:
        creds = read_client_file(client_file(tmp_path / "plain"))
        assert url.startswith(f"http://{address}:") and creds.ssl_cert_file is None and creds.auth_string
        assert "PREFECT_API_SSL_CERT_FILE" not in os.environ and not (tmp_path / "plain" / "api-tls").exists()
        assert status_of(url, None) == 401 and status_of(url, creds.auth_string) == 200
    with prefect_api(tmp_path / "local", ui=False, tls=True) as url:
        creds = read_client_file(client_file(tmp_path / "local"))
        assert url.startswith("https://127.0.0.1:") and creds.auth_string is None
        assert os.environ["PREFECT_API_SSL_CERT_FILE"] == creds.ssl_cert_file == str(tmp_path / "local/api-tls/ca.pem")
        assert status_of(url, None, creds.ssl_cert_file) == 200
        assert status_of(url.replace("127.0.0.1", "localhost"), None, creds.ssl_cert_file) == 200  # both names
    assert not (tmp_path / "local" / "api-tls").exists() and not client_file(tmp_path / "local").exists()


# -- batch schedulers: one authed server for the module, the CLI reuses it --------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server on this machine's non-loopback address with HTTPS and auth, as ``--server-host`` starts it."""
    from espnet3_prefect.server.embedded import forget_server, start_recorded
    from espnet3_prefect.server.process import stop_server

    address = non_loopback_address()
    home = tmp_path_factory.mktemp("authed-home")
    info = start_recorded(home, ui=False, host=address, auth=True, tls=True, given_host=address)
    (home / "users").mkdir(exist_ok=True)
    (home / "users" / str(info["pid"])).touch()  # a user: the CLI runs leave it running
    try:
        creds = read_client_file(client_file(home))
        assert creds.api_url.startswith("https://") and creds.ssl_cert_file
        yield {
            "home": home,
            "address": address,
            "info": info,
            "creds": creds,
            "key_lines": tls_files(home)["key_lines"],
        }
    finally:
        stop_server(info["pid"])
        forget_server(home, info["pid"], info["api_url"])


def job_probe(env: str, tag_prefix: str = "e3p-"):
    """What the scheduler tells anyone about our running jobs: ``scontrol show job -dd`` and the held
    batch script (SLURM), ``qstat -j`` (Grid Engine)."""
    asked: set[str] = set()

    def probe() -> list[str]:
        out = []
        for job_id, name in queue_jobs(env):
            if not name.startswith(tag_prefix) or job_id in asked:
                continue
            asked.add(job_id)
            commands = (
                [["scontrol", "show", "job", "-dd", job_id], ["scontrol", "write", "batch_script", job_id, "-"]]
                if env == "slurm"
                else [["qstat", "-j", job_id]]
            )
            for command in commands:
                done = subprocess.run(command, capture_output=True, text=True, timeout=30)
                out.append(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
        return out

    return probe


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge)])
def scheduler(request):
    return request.getfixturevalue(request.param)


def test_batch_workers_record_task_runs_through_the_client_file(scheduler, served, tmp_path):
    env, home, creds = scheduler["env"], served["home"], served["creds"]
    cfg = toy_config(tmp_path, n=8, num_shards=2)
    cfg["runner"]["_target_"] = "tests.helpers.toy.JobRecordingRunner"
    cfg["provider"]["params"].update(job_log=str(tmp_path / "jobs.log"))
    cfg["parallel"] = batch_parallel(scheduler, n_workers=2, num_shards=2)
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    run_env = cli_env(home)
    script = subprocess.run(
        [*CLI, "cluster-script", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**run_env, **creds.environ(), "ESPNET3_PREFECT_CLIENT_FILE": creds.source},
        cwd=tmp_path,
    )
    assert script.returncode == 0, script.stderr
    assert f"export ESPNET3_PREFECT_CLIENT_FILE={creds.source}" in script.stdout
    assert "--preload espnet3_prefect.execution.worker_api" in script.stdout
    assert "PREFECT_API_SSL_CERT_FILE" not in script.stdout  # the client file names it

    watch = Watch(job_probe(env))
    watch.start()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path), "--server-host", served["address"]],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=500,
        cwd=tmp_path,
    )
    watch.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        f"Prefect API: {creds.api_url} (HTTPS, verified with {creds.ssl_cert_file}; basic auth; credential in"
        in proc.stderr
    )
    jobs = {line.split()[0] for line in (tmp_path / "jobs.log").read_text().splitlines()}
    assert jobs and all(j.isdigit() for j in jobs), jobs  # the items were computed inside batch jobs
    assert any(
        f"$ {'scontrol show job' if env == 'slurm' else 'qstat -j'}" in text and any(j in text for j in jobs)
        for text in watch.probed
    ), watch.probed
    seen = recorded(creds)
    shards = {name: state for name, state in seen["tasks"].items() if name.startswith("run-shard-test_a")}
    assert len(shards) >= 2 and set(shards.values()) == {"COMPLETED"}, seen["tasks"]
    assert_only_both_get_in(probe(creds.api_url, creds.auth_string, creds.ssl_cert_file))
    places = dict(
        cluster_script=script.stdout + script.stderr,
        cli_output=proc.stdout + proc.stderr,
        scheduler_views=watch.probed,
        command_lines=watch.cmdlines,
        flow_run_parameters=seen["parameters"],
        flow_run_logs=seen["logs"],
        job_logs_and_outputs=texts_under(tmp_path / "inference"),
        server_log=(home / "server.log").read_text(),
    )
    assert_nowhere(creds.auth_string, **places)
    assert_nowhere(served["key_lines"], **places)


@pytest.mark.slurm
def test_a_client_file_the_node_cannot_read_fails_the_run_on_one_line(slurm, served, tmp_path):
    cfg = toy_config(tmp_path, n=4, num_shards=1)
    missing = tmp_path / "not-on-this-node" / "api-client.json"
    # As if the state dir were not on a filesystem the compute node mounts: the job looks elsewhere.
    cfg["parallel"] = batch_parallel(
        slurm, n_workers=1, num_shards=1, job_script_prologue=[f"export ESPNET3_PREFECT_CLIENT_FILE={missing}"]
    )
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path), "--server-host", served["address"]],
        env=cli_env(served["home"]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    line = (
        f"espnet3-prefect worker: Prefect client file {missing}: missing (is the state dir on a filesystem "
        f"this node sees?)"
    )
    assert line in proc.stderr, proc.stderr[-3000:]
    assert "ended before a Dask worker connected" in proc.stderr
    assert time.monotonic() - started < 240


@pytest.mark.slurm
def test_a_server_of_your_own_over_https_with_your_ca_serves_batch_workers(slurm, served, tmp_path):
    """``PREFECT_API_URL=https://...`` with ``PREFECT_API_SSL_CERT_FILE`` (your CA) and a credential: no
    embedded server; SLURM workers verify your server with your CA file through the external client file."""
    creds = served["creds"]  # stands in for your server: HTTPS with its own authority, basic auth
    cfg = toy_config(tmp_path, n=6, num_shards=2)
    cfg["dataset"]["test"][0]["name"] = "own_server"
    cfg["runner"]["_target_"] = "tests.helpers.toy.JobRecordingRunner"
    cfg["provider"]["params"].update(job_log=str(tmp_path / "jobs.log"))
    cfg["parallel"] = batch_parallel(slurm, n_workers=1, num_shards=2)
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    home = tmp_path / "own-home"
    env = {
        **cli_env(home),
        "PREFECT_API_URL": creds.api_url,
        "PREFECT_API_AUTH_STRING": creds.auth_string,
        "PREFECT_API_SSL_CERT_FILE": creds.ssl_cert_file,
    }
    tls_flag = subprocess.run(
        [*CLI, "infer", "--config", str(path), "--server-tls"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert tls_flag.returncode != 0 and "--server-tls: PREFECT_API_URL is set" in tls_flag.stderr
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path)], env=env, capture_output=True, text=True, timeout=500, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    external = read_client_file(home / "api-client-external.json")
    assert (external.api_url, external.ssl_cert_file) == (creds.api_url, creds.ssl_cert_file)
    assert not (home / "server.json").exists() and not (home / "api-tls").exists()  # no embedded server
    jobs = {line.split()[0] for line in (tmp_path / "jobs.log").read_text().splitlines()}
    assert jobs and all(j.isdigit() for j in jobs), jobs
    shards = {n: s for n, s in recorded(creds)["tasks"].items() if n.startswith("run-shard-own_server")}
    assert len(shards) == 2 and set(shards.values()) == {"COMPLETED"}, shards


@pytest.mark.ssh
def test_ssh_workers_record_task_runs_through_the_client_file(sshd, served, tmp_path):
    creds = served["creds"]
    cfg = toy_config(tmp_path, n=6, num_shards=2)
    cfg["runner"]["_target_"] = "tests.helpers.toy.JobRecordingRunner"
    cfg["provider"]["params"].update(job_log=str(tmp_path / "pids.log"))
    connect = {
        "port": sshd["port"],
        "username": sshd["user"],
        "client_keys": [sshd["key"]],
        "known_hosts": sshd["known_hosts"],
    }
    cfg["parallel"] = {
        "env": "ssh",
        "n_workers": 1,
        "num_shards": 2,
        "options": {"hosts": [sshd["host"], sshd["host"]], "connect_options": connect},
    }
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    watch = Watch()
    watch.start()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path), "--server-host", served["address"]],
        env=cli_env(served["home"]),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    watch.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = {line.split()[1] for line in (tmp_path / "pids.log").read_text().splitlines()}
    assert pids and str(os.getpid()) not in pids
    remote = [env for env in watch.dask_spec_environs if env.get("ESPNET3_PREFECT_CLIENT_FILE") == str(creds.source)]
    assert remote, "no ssh-started Dask process had the client file's path in its environment"
    assert not any("PREFECT_API_AUTH_STRING" in env for env in remote)  # it came from the file, not the ssh command
    assert not any("PREFECT_API_SSL_CERT_FILE" in env for env in remote)  # nor the certificate's path
    seen = recorded(creds)
    assert sum(1 for n, st in seen["tasks"].items() if n.startswith("run-shard-test_a") and st == "COMPLETED") >= 2
    places = dict(
        cli_output=proc.stdout + proc.stderr,
        command_lines=watch.cmdlines,
        remote_environments=[json.dumps(env) for env in watch.dask_spec_environs],
        flow_run_parameters=seen["parameters"],
        flow_run_logs=seen["logs"],
    )
    assert_nowhere(creds.auth_string, **places)
    assert_nowhere(served["key_lines"], **places)


# -- a worker in its own network namespace --------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def netns():
    """A network namespace joined to this one by a veth pair: host side 10.213.X.1/24, namespace side .2."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (Debian package iproute2)")
    x = random.randint(1, 254)
    name, host_if, ns_if = f"e3p-sec-{x}-{os.getpid()}", f"e3ph{x}", f"e3pn{x}"
    created = _ip("netns", "add", name, check=False)
    if created.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {created.stderr.strip()}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"10.213.{x}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"10.213.{x}.2/24", "dev", ns_if)
        _ip("netns", "exec", name, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield {"name": name, "host": f"10.213.{x}.1", "worker": f"10.213.{x}.2"}
    finally:
        _ip("link", "delete", host_if, check=False)
        _ip("netns", "delete", name, check=False)


def test_a_worker_in_another_network_namespace_records_its_shards(netns, tmp_path):
    from distributed import Client

    from espnet3_prefect._internal.proc import stop_group
    from espnet3_prefect.server.embedded import forget_server, start_recorded
    from espnet3_prefect.server.process import stop_server

    home = tmp_path / "home"
    home.mkdir()
    info = start_recorded(home, ui=False, host=netns["host"], auth=True, tls=True, given_host=netns["host"])
    (home / "users").mkdir(exist_ok=True)
    (home / "users" / str(info["pid"])).touch()
    creds = read_client_file(client_file(home))
    assert creds.api_url.startswith(f"https://{netns['host']}:")
    key = tls_files(home)["key_lines"]
    watch = Watch()
    watch.start()
    port = random.randint(20000, 40000)
    scheduler_address = f"tcp://{netns['host']}:{port}"
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ESPNET3_PREFECT"))}
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_scheduler",
                    "--host",
                    netns["host"],
                    "--port",
                    str(port),
                    "--dashboard-address",
                    "127.0.0.1:0",
                ],
                env=plain,
                stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / "scheduler.log", "wb"),
                start_new_session=True,
            )
        )
        worker_env = {**plain, "PYTHONPATH": str(ROOT), "ESPNET3_PREFECT_CLIENT_FILE": creds.source}
        procs.append(
            subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    netns["name"],
                    sys.executable,
                    "-m",
                    "distributed.cli.dask_worker",
                    scheduler_address,
                    "--host",
                    netns["worker"],
                    "--nthreads",
                    "1",
                    "--preload",
                    "espnet3_prefect.execution.worker_api",
                    "--dashboard-address",
                    "127.0.0.1:0",
                ],
                env=worker_env,
                stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / "worker.log", "wb"),
                start_new_session=True,
            )
        )

        def workers():
            try:
                with Client(scheduler_address, timeout=10) as client:
                    return list(client.scheduler_info(n_workers=-1)["workers"])
            except OSError:
                return []

        [worker] = wait_for(workers, 180, "the worker in the namespace to join the scheduler")
        assert worker.startswith(f"tcp://{netns['worker']}:"), worker

        cfg = toy_config(tmp_path, n=6, num_shards=2)
        cfg["runner"]["_target_"] = "tests.helpers.toy.JobRecordingRunner"
        cfg["provider"]["params"].update(job_log=str(tmp_path / "jobs.log"))
        cfg["parallel"] = {"address": scheduler_address, "n_workers": 1, "num_shards": 2}
        path = write_yaml(tmp_path / "inference.yaml", cfg)
        proc = subprocess.run(
            [*CLI, "infer", "--config", str(path), "--server-host", netns["host"]],
            env=cli_env(home),
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + (tmp_path / "worker.log").read_text()[-2000:]
        pids = {int(line.split()[1]) for line in (tmp_path / "jobs.log").read_text().splitlines()}
        for pid in pids:  # every item was computed by a process in the namespace
            assert _ip("netns", "identify", str(pid)).stdout.strip() == netns["name"], pid
        seen = recorded(creds)
        shards = {n: s for n, s in seen["tasks"].items() if n.startswith("run-shard-test_a")}
        assert len(shards) == 2 and set(shards.values()) == {"COMPLETED"}, seen["tasks"]
        assert_only_both_get_in(probe(creds.api_url, creds.auth_string, creds.ssl_cert_file))
        # From the namespace, over the veth pair: the same four answers.
        reach = subprocess.run(
            ["ip", "netns", "exec", netns["name"], sys.executable, "-m", "tests.helpers.https_api", creds.source],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env={**plain, "PYTHONPATH": str(ROOT)},
        )
        assert reach.returncode == 0, reach.stderr
        assert_only_both_get_in(json.loads(reach.stdout))
        watch.stop()
        assert_nowhere(
            key,
            cli_output=proc.stdout + proc.stderr,
            command_lines=watch.cmdlines,
            flow_run_logs=seen["logs"],
            server_log=(home / "server.log").read_text(),
            worker_log=(tmp_path / "worker.log").read_text() + "(collected)",
        )
    finally:
        watch.stop()
        for proc in reversed(procs):
            stop_group(proc.pid, 20)
        stop_server(info["pid"])
        forget_server(home, info["pid"], info["api_url"])
    assert not (home / "api-tls").exists()


# -- deploy-local --host: the deployments' server, worker and flow runs with auth ------------------


@pytest.mark.postgres
@pytest.mark.parametrize("database", DATABASES)
def test_deploy_local_beyond_loopback_over_https_with_auth_and_a_detached_run(tmp_path, database):
    """On SQLite, and on PostgreSQL (``--database``): then its password, too, is nowhere."""
    from espnet3_prefect.server.process import free_port

    address = non_loopback_address()
    project = copy_project(tmp_path)
    home = tmp_path / "home"
    env = cli_env(home)
    options, db_password = [], None
    if database == "postgres":
        from tests.helpers.postgres import fresh_database

        db = fresh_database()
        options, env["PGPASSFILE"] = ["--database", db.url], str(db.passfile)
        db_password = db.passfile.read_text().strip().rsplit(":", 1)[1]
    watch = Watch()
    watch.start()
    try:
        proc = subprocess.run(
            [
                *CLI,
                "deploy-local",
                "--host",
                address,
                "--port",
                str(free_port(address)),
                "--project-dir",
                str(project),
                *options,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=500,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        creds = read_client_file(client_file(home))
        tls = tls_files(home)
        assert (
            creds.api_url.startswith(f"https://{address}:") and f"export PREFECT_API_URL={creds.api_url}" in proc.stdout
        )
        assert f"UI:      {creds.api_url[: -len('/api')]}" in proc.stdout
        assert f"auth:    basic auth; credential in {home / 'api-client.json'} (mode 0600)" in proc.stdout
        assert f"export PREFECT_API_SSL_CERT_FILE={tls['ca']}" in proc.stdout and creds.ssl_cert_file == tls["ca"]
        assert_only_both_get_in(probe(creds.api_url, creds.auth_string, creds.ssl_cert_file))
        assert ui_settings(creds.api_url[: -len("/api")], creds)["api_url"] == creds.api_url
        cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=6, num_shards=2))
        detached = subprocess.run(
            [*CLI, "infer", "--detach", "--config", str(cfg)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert detached.returncode == 0, detached.stderr[-3000:]
        run_id = detached.stdout.split("flow run id: ")[1].split()[0]
        assert f"watch:       PREFECT_API_SSL_CERT_FILE={tls['ca']} PREFECT_API_URL={creds.api_url}" in detached.stdout
        with creds.sync_client() as client:  # the process pool's flow run reaches the server over HTTPS
            deadline = time.monotonic() + 300
            while not (run := client.read_flow_run(run_id)).state.is_final() and time.monotonic() < deadline:
                time.sleep(1)
        assert run.state.is_completed(), run.state.message
        watch.stop()
        seen = recorded(creds)
        assert {"run-shard-test_a-0", "run-shard-test_a-1"} <= set(seen["tasks"]), seen["tasks"]
        places = dict(
            cli_output=proc.stdout + proc.stderr + detached.stdout + detached.stderr,
            flow_run_parameters=seen["parameters"],
            flow_run_logs=seen["logs"],
            command_lines=watch.cmdlines,
            our_files=texts_under(home, tmp_path / "inference"),
            worker_log=(home / "worker.log").read_text(),
        )
        assert_nowhere(creds.auth_string, **places)
        assert_nowhere(tls["key_lines"], **places)
        if db_password is not None:
            assert f"runs in: {db.url}" in proc.stdout
            assert_nowhere(db_password, **places, server_log=(home / "server.log").read_text())
    finally:
        watch.stop()
        stop = subprocess.run([*CLI, "deploy-local", "--stop"], env=env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert not client_file(home).exists() and not (home / "api-tls").exists()
