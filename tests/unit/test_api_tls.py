"""HTTPS for the embedded Prefect API (api_tls, api_host.tls_required): the certificate a server start
makes (names, files, modes, verified only for its own names), when HTTPS is on, the client file's
``ssl_cert_file`` and what clients and batch jobs get from it."""

from __future__ import annotations

import socket
import ssl
import stat
import subprocess
import threading

import pytest

from espnet3_prefect._internal.util import CLIENT_FILE_VAR
from espnet3_prefect.disk.client_file import ClientCredentials, CredentialFileError, read_client_file, write_client_file
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends.base import exported_environment
from espnet3_prefect.server.host import tls_required
from espnet3_prefect.server.https import ServerTLS, certificate_names
from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env


def handshake(tls: ServerTLS, name: str, cafile: str | None) -> str:
    """Serve one TLS handshake with ``tls``'s files on 127.0.0.1; connect as a client that expects
    ``name`` and trusts ``cafile``; return "ok" or the verification error."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tls.cert_file, tls.key_file)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as wrapped:
                wrapped.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cafile=cafile)
    client.verify_flags |= ssl.VERIFY_X509_STRICT  # what Python 3.13 turns on by default
    try:
        with (
            socket.create_connection(listener.getsockname()) as raw,
            client.wrap_socket(raw, server_hostname=name) as s,
        ):
            s.send(b"x")
            return "ok"
    except ssl.SSLCertVerificationError as exc:
        return exc.verify_message
    finally:
        thread.join(10)
        listener.close()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return ServerTLS.of(tmp_path_factory.mktemp("home")).create("10.1.2.3", "login1.cluster")


def test_files_are_private_and_hold_one_key(made):
    assert stat.S_IMODE(made.directory.stat().st_mode) == 0o700
    assert sorted(p.name for p in made.directory.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in made.directory.iterdir())
    keys = [p.name for p in made.directory.iterdir() if "PRIVATE KEY" in p.read_text()]
    assert keys == ["key.pem"]  # the authority's key was never written


def test_the_certificate_names_where_the_server_listens(made):
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(made.cert_file.read_bytes())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in alt.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    assert alt.get_values_for_type(x509.DNSName) == ["login1.cluster"]


def test_clients_verify_it_by_address_and_name_and_nothing_else(tmp_path):
    tls = ServerTLS.of(tmp_path).create("127.0.0.1")
    assert handshake(tls, "127.0.0.1", str(tls.ca_file)) == "ok"
    assert handshake(tls, "localhost", str(tls.ca_file)) == "ok"
    assert "not valid for '10.9.9.9'" in handshake(tls, "10.9.9.9", str(tls.ca_file))
    assert "unable to get local issuer certificate" in handshake(tls, "127.0.0.1", None)  # the system's CAs
    other = ServerTLS.of(tmp_path / "other").create("127.0.0.1")
    assert "unable to get local issuer certificate" in handshake(tls, "127.0.0.1", str(other.ca_file))


def test_a_new_start_replaces_the_files_and_remove_takes_them(tmp_path):
    first = ServerTLS.of(tmp_path).create("127.0.0.1")
    key = first.key_file.read_text()
    second = ServerTLS.of(tmp_path).create("127.0.0.1")
    assert second.key_file.read_text() != key
    second.remove()
    assert not second.directory.exists()


def test_names_of_a_wildcard_bind_and_of_an_interface():
    ips, names = certificate_names("0.0.0.0", "0.0.0.0")
    assert "127.0.0.1" in ips and socket.gethostname() in names
    assert certificate_names("127.0.0.1", "lo") == (["127.0.0.1"], ["localhost"])  # an interface is no DNS name


def test_https_is_on_off_loopback_unless_turned_off_and_never_without_auth_too():
    assert tls_required("10.0.0.5", None, None) is True and tls_required("127.0.0.1", None, None) is False
    assert tls_required("127.0.0.1", True, None) is True and tls_required("10.0.0.5", False, None) is False
    assert tls_required("127.0.0.1", False, False) is False
    with pytest.raises(ConfigError) as err:
        tls_required("10.0.0.5", False, False)
    assert str(err.value).startswith("refusing to serve the Prefect API on 10.0.0.5 without TLS and without auth")
    assert "\n" not in str(err.value)


def test_the_cli_refuses_no_tls_with_no_auth_on_one_line_before_anything_starts(tmp_path):
    home = tmp_path / "home"
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=2, num_shards=1))
    refused = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "--server-host", "10.0.0.5", "--no-server-tls", "--no-server-auth"],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: refusing to serve the Prefect API on 10.0.0.5 without TLS and without auth: anyone on the network "
        "could read and change your runs (drop --no-server-tls/--no-tls or --no-server-auth/--no-auth)"
    ]
    assert not (home / "server.json").exists() and not (home / "api-tls").exists()


def test_client_file_names_the_certificate_and_clients_verify_with_it(made, tmp_path):
    path = write_client_file(
        tmp_path / "api-client.json",
        ClientCredentials("https://10.1.2.3:4200/api", "espnet3:s3cret", ssl_cert_file=str(made.ca_file)),
    )
    creds = read_client_file(path)
    assert creds.ssl_cert_file == str(made.ca_file)
    assert creds.environ() == {
        "PREFECT_API_URL": "https://10.1.2.3:4200/api",
        "PREFECT_API_AUTH_STRING": "espnet3:s3cret",
        "PREFECT_API_SSL_CERT_FILE": str(made.ca_file),
        "PREFECT_API_TLS_INSECURE_SKIP_VERIFY": "false",
    }


@pytest.mark.parametrize(
    "record, words",
    [
        ('{"api_url": "http://h:1/api", "ssl_cert_file": "CA"}', "ssl_cert_file is for an https:// api_url"),
        (
            '{"api_url": "https://h:1/api", "ssl_cert_file": "/nowhere/ca.pem"}',
            "ssl_cert_file /nowhere/ca.pem: cannot read it",
        ),
        ('{"api_url": "https://h:1/api", "ssl_cert_file": ""}', "ssl_cert_file must be the path of a certificate file"),
    ],
)
def test_a_bad_certificate_entry_is_one_line_naming_the_file(tmp_path, made, record, words):
    path = tmp_path / "api-client.json"
    path.write_text(record.replace("CA", str(made.ca_file)))
    path.chmod(0o600)
    with pytest.raises(CredentialFileError) as err:
        read_client_file(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value) and words in str(err.value)


def test_batch_jobs_get_the_certificate_path_only_without_a_client_file():
    own = {"PREFECT_API_URL": "https://prefect.example:443/api", "PREFECT_API_SSL_CERT_FILE": "/shared/ca.pem"}
    assert exported_environment(own) == own  # a server of the user's, with their CA, no credential
    assert exported_environment({**own, CLIENT_FILE_VAR: "/p/api-client.json"}) == {
        CLIENT_FILE_VAR: "/p/api-client.json"
    }
    assert exported_environment({"PREFECT_API_URL": "http://127.0.0.1:1/api", "PREFECT_API_SSL_CERT_FILE": "/x"}) == {
        "PREFECT_API_URL": "http://127.0.0.1:1/api"
    }
