"""The Prefect API credential: the 0600 client file (written, read, refused when bad), where a server may
listen without auth, and what batch jobs and SSH workers get (the file's path, never the credential)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys

import pytest

from espnet3_prefect._internal.util import CLIENT_FILE_PRELOAD, CLIENT_FILE_VAR
from espnet3_prefect.disk.client_file import (
    ClientCredentials,
    CredentialFileError,
    load_client_environ,
    read_client_file,
    write_client_file,
)
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends import cluster_kwargs
from espnet3_prefect.execution.backends.base import exported_environment
from espnet3_prefect.execution.backends.preview import render_job_script
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.server.auth import new_auth_string
from espnet3_prefect.server.host import auth_required, resolve_host

SECRET = "espnet3:unit-test-secret-0123456789"


@pytest.fixture
def good_file(tmp_path):
    return write_client_file(tmp_path / "api-client.json", ClientCredentials("http://10.0.0.5:4200/api", SECRET))


def test_written_file_is_0600_and_reads_back(good_file):
    assert stat.S_IMODE(good_file.stat().st_mode) == 0o600
    creds = read_client_file(good_file)
    assert (creds.api_url, creds.auth_string, creds.source) == ("http://10.0.0.5:4200/api", SECRET, str(good_file))
    assert SECRET not in repr(creds)  # a stray print or log line never shows it
    assert not list(good_file.parent.glob(".api-client.json.*"))  # no temporary left behind


def test_new_credentials_differ():
    assert new_auth_string() != new_auth_string()


def _bad(tmp_path, text, mode=0o600):
    path = tmp_path / "api-client.json"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: d / "absent.json", "missing"),
        (lambda d: _bad(d, '{"api_url": "http://h:1/api", "auth_string": "u:p"}', 0o644), "mode 0644"),
        (lambda d: _bad(d, "", 0o600), "empty"),
        (lambda d: _bad(d, "api_url=http://h", 0o600), "not JSON"),
        (lambda d: _bad(d, "[1, 2]", 0o600), "not a JSON object"),
        (lambda d: _bad(d, '{"api_url": "h:1/api"}', 0o600), "api_url must be an http(s):// URL"),
        (lambda d: _bad(d, '{"api_url": "http://h:1/api", "auth_string": "nocolon"}', 0o600), "user:password"),
        (lambda d: _bad(d, '{"api_url": "http://h:1/api", "auth_string": ""}', 0o600), "non-empty string"),
        (lambda d: d, "not a regular file"),
    ],
)
def test_bad_client_file_is_one_line_naming_it(tmp_path, make, words):
    path = make(tmp_path)
    with pytest.raises(CredentialFileError) as err:
        read_client_file(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and words in message
    assert "u:p" not in message


def test_load_client_environ_sets_the_prefect_variables(good_file):
    environ = {CLIENT_FILE_VAR: str(good_file)}
    load_client_environ(environ)
    assert environ["PREFECT_API_URL"] == "http://10.0.0.5:4200/api" and environ["PREFECT_API_AUTH_STRING"] == SECRET
    assert load_client_environ({}) is None


def test_no_auth_off_loopback_is_refused():
    assert auth_required("127.0.0.1", None) is False and auth_required("10.0.0.5", None) is True
    with pytest.raises(ConfigError, match="refusing to serve the Prefect API on 10.0.0.5 without auth") as err:
        auth_required("10.0.0.5", False)
    assert "\n" not in str(err.value)


def test_hosts_resolve():
    assert resolve_host("127.0.0.1") == "127.0.0.1"
    assert resolve_host("lo") == "127.0.0.1"  # an interface name
    assert resolve_host("localhost") == "127.0.0.1"
    with pytest.raises(ConfigError, match="--server-host no-such-host.invalid: not an address"):
        resolve_host("no-such-host.invalid")


ENVIRON = {
    "PREFECT_API_URL": "http://10.0.0.5:4200/api",
    "PYTHONPATH": "/home/user/recipes/asr",
    CLIENT_FILE_VAR: "/shared/proj/.e3p/prefect/api-client.json",
    "PREFECT_API_AUTH_STRING": SECRET,
}
SLURM = {
    "env": "slurm",
    "n_workers": 2,
    "options": {"queue": "cpu", "cores": 1, "memory": "1GB", "walltime": "00:30:00"},
}


def test_job_script_gets_the_file_path_and_the_preload_never_the_credential():
    assert exported_environment(ENVIRON) == {
        "PYTHONPATH": "/home/user/recipes/asr",
        CLIENT_FILE_VAR: ENVIRON[CLIENT_FILE_VAR],
    }
    spec = ParallelSpec.from_config(SLURM)
    kwargs = cluster_kwargs(spec, job_name="e3p-x", log_directory="/tmp/logs", environ=ENVIRON)
    script = render_job_script(backends_class("slurm"), kwargs)
    assert f"export {CLIENT_FILE_VAR}={ENVIRON[CLIENT_FILE_VAR]}" in script
    assert f"--preload {CLIENT_FILE_PRELOAD}" in script
    assert SECRET not in script and "PREFECT_API_URL" not in script


def test_without_a_client_file_the_job_script_is_as_before():
    spec = ParallelSpec.from_config(SLURM)
    plain = {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}
    script = render_job_script(backends_class("slurm"), cluster_kwargs(spec, job_name="e3p-x", environ=plain))
    assert "export PREFECT_API_URL=http://127.0.0.1:4200/api" in script and "--preload" not in script


def test_queue_commands_run_without_the_credential(monkeypatch):
    """sbatch copies the submitter's environment into the job: the submission runs without the secret."""
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", SECRET)
    monkeypatch.setenv("E3P_MARKER", "kept")
    spec = ParallelSpec.from_config(SLURM)
    job_cls = cluster_kwargs(spec, job_name="e3p-x", environ=ENVIRON)["job_cls"]
    out = asyncio.run(job_cls._call(["env"]))
    assert "E3P_MARKER=kept" in out and SECRET not in out


def test_ssh_workers_preload_and_get_only_the_path():
    spec = ParallelSpec.from_config({"env": "ssh", "n_workers": 1, "options": {"hosts": ["127.0.0.1", "127.0.0.1"]}})
    kwargs = cluster_kwargs(spec, environ=ENVIRON)
    assert kwargs["worker_options"]["preload"] == [CLIENT_FILE_PRELOAD]
    assert ENVIRON[CLIENT_FILE_VAR] in kwargs["remote_python"] and SECRET not in str(kwargs)


def test_kube_refuses_an_authenticated_api_on_one_line():
    spec = ParallelSpec(env="kube", n_workers=1, options={"image": "registry/e3p:1"})
    with pytest.raises(ConfigError, match="parallel.env 'kube': a Prefect API that asks for auth is not supported"):
        cluster_kwargs(spec, environ=ENVIRON)


def backends_class(env):
    from espnet3_prefect.execution import backends

    return backends.get(env).load_cluster_class()


def _preload(tmp_path, path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    if path is not None:
        env[CLIENT_FILE_VAR] = str(path)
    code = f"import {CLIENT_FILE_PRELOAD}, os; print(os.environ['PREFECT_API_URL'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_preload_sets_the_api_or_stops_on_one_line(tmp_path, good_file):
    ok = _preload(tmp_path, good_file)
    assert ok.returncode == 0 and ok.stdout.strip() == "http://10.0.0.5:4200/api"
    good_file.chmod(0o644)
    bad = _preload(tmp_path, good_file)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        f"espnet3-prefect worker: Prefect client file {good_file}: mode 0644 lets other users read the credential; "
        f"it must be 0600 (chmod 600 {good_file})"
    ]
    unset = _preload(tmp_path, None)
    assert unset.returncode == 1 and f"{CLIENT_FILE_VAR} is not set" in unset.stderr
