"""Dask traffic over TLS on the real single-node SLURM, Grid Engine and sshd (tests/infra/up.sh).

While the workers of a run wait at a gate (tests.helpers.toy.GatedRunner), a probe thread looks at
the live cluster from outside, as another user on the cluster network would: the scheduler address
is ``tls://``; a client speaking plain tcp, one without certificates and one with its own
self-signed certificate are all refused by the scheduler, one with the run's files connects; the
files are 0600 in a 0700 folder; the key's PEM body is in no job script, ``scontrol show job`` /
``qstat -j`` output, process command line or job log. After the run the folder is gone and the
outputs equal env local's. ``parallel.tls: false`` runs plain ``tcp://``.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import toy_config
from tests.integration.test_real_backends import batch_parallel, run_flow, run_tag, sge, slurm, sshd, wait_no_jobs  # noqa: F401

pytestmark = pytest.mark.slow
PROBE_TIMEOUT_S = 150.0


_CONNECT = """
import sys
from distributed import Client
from distributed.security import Security
address, ca, cert, key = sys.argv[1:5]
security = None
if ca == "temporary":
    security = Security.temporary()
elif ca:
    security = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)
try:
    client = Client(address, timeout=4, security=security, set_as_default=False)
except Exception as exc:
    print("refused:", type(exc).__name__, str(exc)[:200])
else:
    print("connected", client.scheduler_info()["address"])
    client.close()
"""


def _refused(address: str, ca: str = "", cert: str = "", key: str = "") -> str | None:
    """None when a client (another process) reaches the scheduler at ``address``; else why it could not.
    ``ca="temporary"``: a client with a self-signed certificate of its own."""
    import sys

    try:
        out = subprocess.run(
            [sys.executable, "-c", _CONNECT, address, ca, cert, key], capture_output=True, text=True, timeout=90
        ).stdout.strip()
    except subprocess.TimeoutExpired:
        return "refused: no answer in 90 s"
    assert out.startswith(("refused:", "connected")), out
    return None if out.startswith("connected") else out


def _key_body(key_file: Path) -> list[str]:
    """Lines of the key's base64 body (any of them showing up anywhere is a leak)."""
    return [line for line in key_file.read_text().splitlines() if line and not line.startswith("-----")]


def _queue_texts(env: str, tag: str) -> dict[str, str]:
    """What the scheduler shows about the run's jobs to anyone who asks."""
    from espnet3_prefect.execution import backends

    texts = {}
    for job in backends.get(env).queue.run_jobs(tag):
        if env == "slurm":
            commands = [["scontrol", "show", "job", job.job_id], ["scontrol", "write", "batch_script", job.job_id, "-"]]
        else:
            commands = [["qstat", "-j", job.job_id]]
        for cmd in commands:
            texts[" ".join(cmd)] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    return texts


class Probe(threading.Thread):
    """Inspects the running cluster (``find`` returns ``(scheduler address, cert folder, extra texts)`` or
    None while not ready), then opens the gate; ``facts`` holds what it saw, ``error`` what went wrong."""

    def __init__(self, gate: Path, find):
        super().__init__(daemon=True)
        self.gate, self.find, self.facts, self.error = gate, find, {}, None

    def run(self):
        try:
            deadline = time.monotonic() + PROBE_TIMEOUT_S
            found = None
            while found is None and time.monotonic() < deadline:
                found = self.find()
                time.sleep(0.5)
            assert found is not None, "no running TLS cluster seen"
            address, folder, texts = found
            self.facts.update(address=address, folder=folder, texts=texts)
            self.facts["dir_mode"] = stat.S_IMODE(os.stat(folder).st_mode)
            self.facts["file_modes"] = {p.name: stat.S_IMODE(p.stat().st_mode) for p in Path(folder).iterdir()}
            self.facts["body"] = _key_body(Path(folder) / "key.pem")
            texts["ps"] = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
            from espnet3_prefect.execution.backends.tls import RunCertificates

            host_port = address.split("://", 1)[1]
            cert, key = str(Path(folder) / "cert.pem"), str(Path(folder) / "key.pem")
            self.facts["plain_tcp"] = _refused(f"tcp://{host_port}")
            self.facts["no_certs"] = _refused(address)
            self.facts["own_cert"] = _refused(address, "temporary")
            # trusts the run's (public) certificate but holds another key: the scheduler must refuse it
            other = RunCertificates(tempfile.mkdtemp(prefix="e3p-test-other-")).create()
            try:
                self.facts["other_key"] = _refused(address, cert, str(other.cert_file), str(other.key_file))
            finally:
                other.remove()
            self.facts["run_certs"] = _refused(address, cert, cert, key)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.gate.write_text("go")


def _check(probe: Probe) -> None:
    probe.join(timeout=PROBE_TIMEOUT_S + 60)
    assert probe.error is None, repr(probe.error)
    facts = probe.facts
    print({k: v for k, v in facts.items() if k not in ("texts", "body")}, sorted(facts["texts"]))
    assert facts["address"].startswith("tls://"), facts["address"]
    for case in ("plain_tcp", "no_certs", "own_cert", "other_key"):
        assert facts[case] is not None, f"{case}: the scheduler accepted a client it should refuse"
    assert facts["run_certs"] is None, facts["run_certs"]
    assert facts["dir_mode"] == 0o700 and facts["file_modes"] == {"cert.pem": 0o600, "key.pem": 0o600}, facts
    assert len(facts["body"]) > 10
    for where, text in facts["texts"].items():
        leaked = [line for line in facts["body"] if line in text]
        assert not leaked, f"key material in {where}"
    assert not Path(facts["folder"]).exists(), "certificate folder left after the run"


def _gated_config(tmp_path: Path, parallel: dict) -> tuple[dict, Path]:
    gate = tmp_path / "gate"
    cfg = toy_config(tmp_path, n=12, num_shards=2)
    cfg["runner"]["_target_"] = "tests.helpers.toy.GatedRunner"
    cfg["provider"]["params"]["gate"] = str(gate)
    cfg["parallel"] = parallel
    return cfg, gate


@pytest.fixture(scope="module")
def local_outputs(tmp_path_factory, prefect_server):
    root = tmp_path_factory.mktemp("tls-local")
    state, _ = run_flow(root, toy_config(root, n=12, num_shards=2))
    assert state.is_completed(), state.message
    return {name: (root / "inference/test_a" / name).read_bytes() for name in ("y.scp", "ref.scp")}


def assert_same_as_local(tmp_path: Path, local_outputs: dict[str, bytes]) -> None:
    """The run's merged files are byte-identical to the ``env: local`` run's."""
    for name, data in local_outputs.items():
        assert (tmp_path / "inference/test_a" / name).read_bytes() == data


def _registered_address(log_dir: Path) -> str | None:
    for path in log_dir.glob("*"):
        if path.is_file():
            found = re.search(r"Registered to:\s+(\S+)", path.read_text(errors="replace"))
            if found:
                return found.group(1)
    return None


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge)])
def scheduler(request):
    return request.getfixturevalue(request.param)


def test_batch_run_over_tls_refuses_clients_without_the_run_certificate(
    scheduler, prefect_server, local_outputs, tmp_path
):
    env = scheduler["env"]
    cfg, gate = _gated_config(tmp_path, batch_parallel(scheduler, n_workers=2, num_shards=2))
    jobs_root = tmp_path / "inference" / ".dask-jobs"

    def find():
        keys = glob.glob(str(jobs_root / "*" / "tls-*" / "key.pem"))
        if not keys:
            return None
        log_dir = Path(keys[0]).parent.parent
        address = _registered_address(log_dir)
        if address is None:
            return None
        texts = _queue_texts(env, log_dir.name.rsplit("-", 1)[-1])
        texts.update({f"log {p.name}": p.read_text(errors="replace") for p in log_dir.glob("*") if p.is_file()})
        return address, keys[0].rsplit("/", 1)[0], texts

    probe = Probe(gate, find)
    probe.start()
    state, flow_run_id = run_flow(tmp_path, cfg)
    _check(probe)
    assert state.is_completed(), state.message
    assert_same_as_local(tmp_path, local_outputs)
    if env == "slurm":  # the submitted script names the files (a positive control for the leak check)
        assert any("--tls-key" in t for k, t in probe.facts["texts"].items() if "batch_script" in k)
    assert wait_no_jobs(env, run_tag(flow_run_id), timeout_s=0) == []


@pytest.mark.slurm
def test_tls_false_runs_plain_tcp(slurm, prefect_server, local_outputs, tmp_path):  # noqa: F811
    cfg = toy_config(tmp_path, n=12, num_shards=2)
    cfg["parallel"] = {**batch_parallel(slurm, n_workers=1, num_shards=2), "tls": False}
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_completed(), state.message
    log_dir = tmp_path / "inference/.dask-jobs" / f"e3p-{run_tag(flow_run_id)}"
    assert (_registered_address(log_dir) or "").startswith("tcp://")
    assert not list(log_dir.glob("tls-*"))
    assert_same_as_local(tmp_path, local_outputs)


@pytest.mark.ssh
def test_ssh_run_over_tls_keeps_the_key_off_command_lines(sshd, prefect_server, local_outputs, tmp_path):  # noqa: F811
    connect = {
        "port": sshd["port"],
        "username": sshd["user"],
        "client_keys": [sshd["key"]],
        "known_hosts": sshd["known_hosts"],
    }
    cfg, gate = _gated_config(
        tmp_path,
        {
            "env": "ssh",
            "n_workers": 2,
            "num_shards": 2,
            "options": {"hosts": [sshd["host"], sshd["host"]], "connect_options": connect},
        },
    )
    started = time.time()
    remote_dirs: set[str] = set()
    remote_modes: dict[str, tuple] = {}

    def find():
        ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
        workers = [line for line in ps.splitlines() if "distributed.cli.dask_spec tls://" in line]
        local = [
            d for d in glob.glob(os.path.join(tempfile.gettempdir(), "e3p-tls-*")) if os.stat(d).st_mtime >= started - 1
        ]
        if len(workers) < 1 or not local:
            return None
        remote_dirs.update(re.findall(r'"tls_\w+_key": "([^"]+)/key.pem"', ps))
        for d in remote_dirs:  # the remote host is this machine: look at the copies
            remote_modes[d] = (
                stat.S_IMODE(os.stat(d).st_mode),
                tuple(sorted(stat.S_IMODE(p.stat().st_mode) for p in Path(d).iterdir())),
            )
        return workers[0].split("dask_spec ", 1)[1].split()[0], local[0], {}

    probe = Probe(gate, find)
    probe.start()
    state, _ = run_flow(tmp_path, cfg)
    _check(probe)
    assert state.is_completed(), state.message
    assert_same_as_local(tmp_path, local_outputs)
    assert len(remote_dirs) >= 2, remote_dirs  # the scheduler's copy and each worker's
    assert set(remote_modes.values()) == {(0o700, (0o600, 0o600))}, remote_modes
    assert not [d for d in remote_dirs if os.path.exists(d)], "remote certificate copies left after the run"
