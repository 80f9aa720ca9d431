"""``parallel.tls``: validation (one line naming the key), the cluster arguments per backend, and the
run's certificate files (modes, removal) used by a real in-process Dask scheduler."""

from __future__ import annotations

import os
import stat

import pytest

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution import backends
from espnet3_prefect.execution.backends.base import ClusterContext
from espnet3_prefect.execution.backends.tls import RunCertificates
from espnet3_prefect.execution.spec import ParallelSpec

BATCH_OPTIONS = {"cores": 1, "memory": "1GB"}
EXTRA = {"htcondor": {"disk": "1GB"}}
SSH_OPTIONS = {"hosts": ["127.0.0.1", "127.0.0.1"]}


def spec(env="slurm", options=None, **block):
    opts = dict(
        {**BATCH_OPTIONS, **EXTRA.get(env, {})}
        if options is None and env not in ("local", "ssh", "kube")
        else options or {}
    )
    if env == "ssh" and options is None:
        opts = dict(SSH_OPTIONS)
    if env == "kube" and options is None:
        opts = {"image": "ghcr.io/me/espnet:1"}
    return ParallelSpec.from_config({"env": env, "options": opts, **block})


@pytest.mark.parametrize("env", ["slurm", "pbs", "sge", "lsf", "htcondor", "moab", "oar", "ssh"])
def test_tls_is_on_by_default_on_batch_schedulers_and_ssh(env):
    assert spec(env).tls is True


@pytest.mark.parametrize("env", ["local", "kube"])
def test_tls_is_off_by_default_on_loopback_and_kube(env):
    assert spec(env).tls is False


@pytest.mark.parametrize(
    "block, message",
    [
        ({"env": "slurm", "tls": "yes"}, "parallel.tls: must be true or false, got 'yes'"),
        ({"env": "slurm", "tls": 1}, "parallel.tls: must be true or false, got 1"),
        ({"env": "kube", "tls": True, "options": {"image": "x"}}, "parallel.tls: not available for env 'kube'"),
        ({"address": "tcp://127.0.0.1:8786", "tls": True}, "parallel.tls: conflicts with parallel.address"),
        ({"address": "tls://127.0.0.1:8786", "tls": False}, "parallel.tls: conflicts with parallel.address"),
        (
            {"env": "slurm", "options": {**BATCH_OPTIONS, "security": True}},
            "parallel.options.security: set by espnet3-prefect",
        ),
        (
            {"env": "slurm", "options": {**BATCH_OPTIONS, "protocol": "tcp://"}},
            "parallel.options.protocol: 'tcp://' conflicts with parallel.tls: true",
        ),
        (
            {"env": "slurm", "tls": False, "options": {**BATCH_OPTIONS, "protocol": "tls://"}},
            "parallel.options.protocol: 'tls' needs parallel.tls: true",
        ),
        (
            {"env": "slurm", "tls": False, "options": {**BATCH_OPTIONS, "shared_temp_directory": "/shared"}},
            "parallel.options.shared_temp_directory: only holds the TLS certificates",
        ),
        (
            {"env": "ssh", "options": {**SSH_OPTIONS, "worker_options": {"security": {}}}},
            "parallel.options.worker_options.security: set by espnet3-prefect",
        ),
        (
            {"env": "ssh", "options": {**SSH_OPTIONS, "scheduler_options": {"protocol": "tcp"}}},
            "parallel.options.scheduler_options.protocol: 'tcp' conflicts",
        ),
        (
            {"env": "local", "tls": True, "options": {"protocol": "tcp://"}},
            "parallel.options.protocol: 'tcp://' conflicts",
        ),
    ],
)
def test_bad_tls_settings_are_one_line_naming_the_key(block, message):
    with pytest.raises(ConfigError) as info:
        ParallelSpec.from_config(block)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_tls_false_and_a_users_protocol_are_kept():
    s = spec("slurm", {**BATCH_OPTIONS, "protocol": "tcp://"}, tls=False)
    kwargs = backends.get("slurm").cluster_kwargs(s, ClusterContext(log_directory="/logs"))
    assert kwargs["protocol"] == "tcp://" and "security" not in kwargs


@pytest.mark.parametrize("env", ["slurm", "pbs", "sge", "lsf", "htcondor", "moab", "oar"])
def test_batch_kwargs_name_the_run_certificate_files(env):
    kwargs = backends.get(env).cluster_kwargs(
        spec(env), ClusterContext(job_name="e3p-0123456789", log_directory="/shared/logs/e3p-0123456789")
    )
    folder = "/shared/logs/e3p-0123456789/tls-e3p-0123456789"
    security = kwargs["security"]
    assert kwargs["protocol"] == "tls://" and security.require_encryption
    assert security.tls_ca_file == security.tls_worker_cert == f"{folder}/cert.pem"
    assert security.tls_worker_key == security.tls_scheduler_key == security.tls_client_key == f"{folder}/key.pem"
    assert "shared_temp_directory" not in kwargs


def test_shared_temp_directory_holds_the_certificate_folder():
    s = spec("slurm", {**BATCH_OPTIONS, "shared_temp_directory": "/scratch/me"})
    kwargs = backends.get("slurm").cluster_kwargs(s, ClusterContext(job_name="e3p-x", log_directory="/logs"))
    assert kwargs["security"].tls_worker_key == "/scratch/me/tls-e3p-x/key.pem"


def test_a_users_log_directory_holds_the_certificate_folder():
    s = spec("sge", {**BATCH_OPTIONS, "log_directory": "/scratch/me/logs"})
    kwargs = backends.get("sge").cluster_kwargs(s, ClusterContext(job_name="e3p-x", log_directory="/default"))
    assert kwargs["security"].tls_worker_key == "/scratch/me/logs/tls-e3p-x/key.pem"


def test_the_job_script_names_the_files_and_never_holds_the_key(tmp_path):
    backend = backends.get("slurm")
    certs = RunCertificates.in_folder(tmp_path, "e3p-x").create()
    kwargs = backend.cluster_kwargs(
        spec("slurm"), ClusterContext(job_name="e3p-x", log_directory=str(tmp_path), certificates=certs)
    )
    _, script = backend.preview(spec("slurm"), kwargs)
    assert f"--tls-key {certs.key_file}" in script and "tls://<insert-scheduler-address-here>" in script
    body = [line for line in certs.key_file.read_text().splitlines() if not line.startswith("-----")]
    assert not [line for line in body if line in script]


def test_local_tls_true_uses_dask_in_memory_certificates():
    assert backends.get("local").cluster_kwargs(spec("local", tls=True), ClusterContext())["security"] is True
    assert "security" not in backends.get("local").cluster_kwargs(spec("local"), ClusterContext())


def test_ssh_kwargs_carry_the_local_certificate_folder(tmp_path):
    backend = backends.get("ssh")
    certs = RunCertificates(tmp_path / "tls")
    assert backend.cluster_kwargs(spec("ssh"), ClusterContext(certificates=certs))["tls_directory"] == str(
        certs.directory
    )
    assert "tls_directory" not in backend.cluster_kwargs(spec("ssh", tls=False), ClusterContext())


def test_certificate_files_are_private_and_removed(tmp_path):
    old = os.umask(0o022)
    try:
        certs = RunCertificates.in_folder(tmp_path / "logs", "e3p-x").create()
    finally:
        os.umask(old)
    assert stat.S_IMODE(certs.directory.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in certs.directory.iterdir()} == {
        "cert.pem": 0o600,
        "key.pem": 0o600,
    }
    assert "PRIVATE KEY" in certs.key_file.read_text()
    first = certs.key_file.read_text()
    certs.create()  # a second attempt of the same run: a fresh key
    assert certs.key_file.read_text() != first
    certs.remove()
    assert not certs.directory.exists()


def test_a_symlinked_certificate_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "tls-e3p-x").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symbolic link"):
        RunCertificates.in_folder(tmp_path, "e3p-x").create()


def test_a_scheduler_with_the_run_certificate_refuses_other_clients(tmp_path):
    """A real scheduler and worker (in this process) over TLS with the files: a client with them
    computes; plain tcp and a client with another key are refused."""
    from distributed import Client, LocalCluster
    from distributed.security import Security

    certs = RunCertificates.in_folder(tmp_path, "e3p-x").create()
    other = RunCertificates.in_folder(tmp_path, "e3p-other").create()
    with LocalCluster(
        n_workers=1,
        processes=False,
        protocol="tls://",
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
        security=certs.security(),
    ) as cluster:
        assert cluster.scheduler_address.startswith("tls://")
        with Client(cluster, set_as_default=False) as client:
            assert client.submit(lambda x: x + 1, 1).result() == 2
        with pytest.raises(Exception):
            Client(cluster.scheduler_address.replace("tls://", "tcp://"), timeout=2, set_as_default=False)
        intruder = Security(
            tls_ca_file=str(certs.cert_file),
            tls_client_cert=str(other.cert_file),
            tls_client_key=str(other.key_file),
            require_encryption=True,
        )
        with pytest.raises(Exception):
            Client(cluster.scheduler_address, security=intruder, timeout=2, set_as_default=False)
