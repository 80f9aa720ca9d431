"""The Prefect API served beyond loopback: its basic-auth credential, and the 0600 client file that
hands the URL and credential to every client (the CLI, deploy-local's worker, local and remote Dask
workers). Where the server listens is :mod:`espnet3_prefect.server.host`'s.

Loopback (the default) runs as before: no credential, plain HTTP. Any other address turns on Prefect's
self-hosted basic auth: the server gets ``PREFECT_SERVER_API_AUTH_STRING`` in its environment
(never on its command line), the clients ``PREFECT_API_AUTH_STRING``. The credential is generated
here (``secrets``) and written with the URL to ``<state dir>/api-client.json``, mode 0600, which
the user's own processes on any node can read and other users cannot. With HTTPS
(:mod:`espnet3_prefect.server.https`) the file also names the certificate clients verify the server with
(``ssl_cert_file``, Prefect's ``PREFECT_API_SSL_CERT_FILE``). Batch jobs and SSH workers
get only the file's path (:data:`~espnet3_prefect._internal.util.CLIENT_FILE_VAR`); the Dask worker preload
:mod:`espnet3_prefect.execution.worker_api` reads it when the worker starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import stat
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from espnet3_prefect._internal.util import CLIENT_FILE_VAR
from espnet3_prefect.errors import ConfigError, Espnet3PrefectError
from espnet3_prefect.server.state_home import CLIENT_HOME_DIR

CLIENT_FILE_NAME = "api-client.json"
AUTH_USER = "espnet3"


class CredentialFileError(Espnet3PrefectError):
    """The client file is missing, readable by others, empty or not what we wrote."""


@dataclass(frozen=True)
class ClientCredentials:
    """What a Prefect client needs: the API URL, with auth on the basic-auth string ``user:secret``, and
    for ``https://`` the certificate (authority) file the server is verified with (``ssl_cert_file``)."""

    api_url: str
    auth_string: str | None = None
    api_key: str | None = None
    source: str | None = None  # the client file these came from, if any
    ssl_cert_file: str | None = None

    def __repr__(self) -> str:  # never print a secret by accident
        return (
            f"ClientCredentials(api_url={self.api_url!r}, auth={'yes' if self.auth_string or self.api_key else 'no'}"
            f", ssl_cert_file={self.ssl_cert_file!r})"
        )

    def environ(self) -> dict[str, str]:
        """The Prefect client variables for these credentials (with a certificate file: verification
        on, whatever the shell said)."""
        env = {"PREFECT_API_URL": self.api_url}
        if self.auth_string:
            env["PREFECT_API_AUTH_STRING"] = self.auth_string
        if self.api_key:
            env["PREFECT_API_KEY"] = self.api_key
        if self.ssl_cert_file:
            env.update(PREFECT_API_SSL_CERT_FILE=self.ssl_cert_file, PREFECT_API_TLS_INSECURE_SKIP_VERIFY="false")
        return env

    def sync_client(self):
        """A ``SyncPrefectClient`` for these credentials, verifying ``https://`` with ``ssl_cert_file``
        whatever this process's Prefect settings say."""
        from prefect.client.orchestration import SyncPrefectClient

        from espnet3_prefect.server.https import client_context

        httpx = {"verify": client_context(self.ssl_cert_file)} if self.api_url.startswith("https://") else None
        return SyncPrefectClient(self.api_url, auth_string=self.auth_string, api_key=self.api_key, httpx_settings=httpx)


def new_auth_string() -> str:
    """A fresh basic-auth credential ``espnet3:<43 random URL-safe characters>``.

    >>> user, secret = new_auth_string().split(":"); user, len(secret)
    ('espnet3', 43)
    """
    return f"{AUTH_USER}:{secrets.token_urlsafe(32)}"


# -- the client file -----------------------------------------------------------------------------


def client_file(home: str | os.PathLike) -> Path:
    """Where the client file of the server whose state is in ``home`` lives."""
    return Path(home) / CLIENT_FILE_NAME


def write_client_file(path: str | os.PathLike, creds: ClientCredentials) -> Path:
    """Write ``creds`` to ``path`` with mode 0600 from the first byte (a new file renamed into place)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    record: dict = {"api_url": creds.api_url, "auth_string": creds.auth_string}
    if creds.api_key:
        record["api_key"] = creds.api_key
    if creds.ssl_cert_file:
        record["ssl_cert_file"] = creds.ssl_cert_file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_client_file(path: str | os.PathLike) -> ClientCredentials:
    """The credentials in a client file, checked: a regular file of the user's, not readable by group or
    others (0600), JSON with an ``http(s)://`` ``api_url`` (and for ``https://`` maybe an
    ``ssl_cert_file`` this node can read); every failure is one line naming the file."""
    path = Path(path)
    where = f"Prefect client file {path}"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise CredentialFileError(f"{where}: missing (is the state dir on a filesystem this node sees?)") from None
    except OSError as exc:
        raise CredentialFileError(f"{where}: cannot read it ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise CredentialFileError(f"{where}: not a regular file")
    if info.st_mode & 0o077:
        raise CredentialFileError(
            f"{where}: mode {stat.S_IMODE(info.st_mode):04o} lets other users read the "
            f"credential; it must be 0600 (chmod 600 {path})"
        )
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CredentialFileError(f"{where}: owned by uid {info.st_uid}, not by you (uid {os.getuid()})")
    try:
        text = path.read_text()
    except OSError as exc:
        raise CredentialFileError(f"{where}: cannot read it ({exc.strerror})") from None
    if not text.strip():
        raise CredentialFileError(f"{where}: empty")
    try:
        record = json.loads(text)
    except ValueError:
        raise CredentialFileError(f'{where}: not JSON like {{"api_url": ..., "auth_string": ...}}') from None
    if not isinstance(record, dict):
        raise CredentialFileError(f"{where}: not a JSON object")
    url = record.get("api_url")
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise CredentialFileError(f"{where}: api_url must be an http(s):// URL, got {url!r}")
    values = {}
    for key in ("auth_string", "api_key"):
        value = record.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise CredentialFileError(f"{where}: {key} must be a non-empty string")
        values[key] = value
    if values["auth_string"] is not None and ":" not in values["auth_string"]:
        raise CredentialFileError(f"{where}: auth_string must read user:password")
    return ClientCredentials(
        url,
        values["auth_string"],
        values["api_key"],
        source=str(path),
        ssl_cert_file=_cert_file(record.get("ssl_cert_file"), url, where),
    )


def _cert_file(value, url: str, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise CredentialFileError(f"{where}: ssl_cert_file must be the path of a certificate file")
    if not url.startswith("https://"):
        raise CredentialFileError(f"{where}: ssl_cert_file is for an https:// api_url, got {url!r}")
    try:
        with open(value, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise CredentialFileError(f"{where}: ssl_cert_file {value}: cannot read it ({exc.strerror})") from None
    return value


def load_client_environ(environ: MutableMapping[str, str] | None = None) -> ClientCredentials | None:
    """Read the client file ``$ESPNET3_PREFECT_CLIENT_FILE`` names and set the Prefect client variables
    in ``environ`` (default ``os.environ``); None when the variable is not set."""
    environ = os.environ if environ is None else environ
    path = environ.get(CLIENT_FILE_VAR)
    if not path:
        return None
    creds = read_client_file(path)
    environ.update(creds.environ())
    return creds


# -- which credentials a run uses -----------------------------------------------------------------

EXTERNAL_CLIENT_FILE_NAME = "api-client-external.json"


def server_client(
    home: Path, info: Mapping, *, wanted_host: str | None, wanted_auth: bool, wanted_tls: bool = False
) -> ClientCredentials:
    """The credentials for the embedded server recorded in ``home`` (``info``: its ``server.json``);
    one line when that server does not listen where asked or lacks the auth or HTTPS asked for."""
    running_host, running_auth = info.get("host", "127.0.0.1"), bool(info.get("auth"))
    running_tls = bool(info.get("tls"))
    stop = f"stop it first (espnet3-prefect servers --stop {info.get('pid')}) or use another --state-dir"
    if wanted_host and running_host != wanted_host:
        raise ConfigError(
            f"--server-host {wanted_host}: the Prefect server of state dir {home} already runs on "
            f"{info.get('api_url')} (pid {info.get('pid')}); {stop}"
        )
    if wanted_auth and not running_auth:
        raise ConfigError(
            f"the Prefect server of state dir {home} already runs without auth on "
            f"{info.get('api_url')} (pid {info.get('pid')}); {stop}"
        )
    if wanted_tls and not running_tls:
        raise ConfigError(
            f"the Prefect server of state dir {home} already runs without HTTPS on "
            f"{info.get('api_url')} (pid {info.get('pid')}); {stop}"
        )
    if not (running_auth or running_tls):
        return ClientCredentials(str(info["api_url"]))
    creds = read_client_file(client_file(home))
    if creds.api_url != info["api_url"]:
        raise CredentialFileError(
            f"Prefect client file {creds.source}: names {creds.api_url}, but the server "
            f"of this state dir is {info['api_url']}; {stop}"
        )
    return creds


def external_client(state: Callable[[], Path]) -> ClientCredentials | None:
    """With ``$PREFECT_API_URL`` (a server of the user's): the client file workers on other nodes read,
    or None when the shell holds no credential (then workers need none either). ``$ESPNET3_PREFECT_CLIENT_FILE``
    when set (checked now), else ``$PREFECT_API_AUTH_STRING``/``$PREFECT_API_KEY`` (and the
    ``$PREFECT_API_SSL_CERT_FILE`` your server is verified with) written to
    ``<state dir>/api-client-external.json`` (0600); ``state()`` gives the state dir."""
    if os.environ.get(CLIENT_FILE_VAR):
        creds = read_client_file(os.environ[CLIENT_FILE_VAR])
        if creds.api_url != os.environ["PREFECT_API_URL"]:
            raise CredentialFileError(
                f"Prefect client file {creds.source}: names {creds.api_url}, but "
                f"PREFECT_API_URL is {os.environ['PREFECT_API_URL']}"
            )
        return creds
    auth_string, api_key = os.environ.get("PREFECT_API_AUTH_STRING"), os.environ.get("PREFECT_API_KEY")
    if not (auth_string or api_key):
        return None
    url, cert = os.environ["PREFECT_API_URL"], os.environ.get("PREFECT_API_SSL_CERT_FILE") or None
    creds = ClientCredentials(
        url,
        auth_string or None,
        api_key or None,
        ssl_cert_file=str(Path(cert).resolve()) if cert and url.startswith("https://") else None,
    )
    path = write_client_file(state() / EXTERNAL_CLIENT_FILE_NAME, creds)
    return dataclasses.replace(creds, source=str(path))


def exported_client_env(creds: ClientCredentials, home: Path | None = None) -> dict[str, str]:
    """What this process exports for ``creds``: the Prefect client variables (local processes inherit
    them), the client file's path (what batch jobs and SSH workers get) and, for the embedded server
    (``home``), ``PREFECT_HOME``."""
    env = creds.environ()
    if creds.source:
        env[CLIENT_FILE_VAR] = creds.source
    if home is not None:
        env["PREFECT_HOME"] = str(Path(home) / CLIENT_HOME_DIR)
    return env


@contextlib.contextmanager
def exported(creds: ClientCredentials | None, home: Path | None = None) -> Iterator[None]:
    """``creds`` (a :class:`~espnet3_prefect.server.auth.ClientCredentials`, None: nothing to add) in
    ``os.environ`` and in Prefect's settings for this process, and back as they were on exit."""
    if creds is None:
        yield
        return
    updates = exported_client_env(creds, home)
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        from prefect.settings import (
            PREFECT_API_AUTH_STRING,
            PREFECT_API_SSL_CERT_FILE,
            PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
            PREFECT_API_URL,
            temporary_settings,
        )

        settings = {PREFECT_API_URL: creds.api_url}
        if creds.auth_string:
            settings[PREFECT_API_AUTH_STRING] = creds.auth_string
        if creds.ssl_cert_file:
            settings.update(
                {PREFECT_API_SSL_CERT_FILE: creds.ssl_cert_file, PREFECT_API_TLS_INSECURE_SKIP_VERIFY: False}
            )
        with temporary_settings(updates=settings):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
