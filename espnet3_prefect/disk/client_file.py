"""The client file: the 0600 JSON that hands a Prefect API's URL, credential and certificate to every
client (the CLI, deploy-local's worker, local and remote Dask workers), and :class:`ClientCredentials`,
what it holds. Written by the server side (:mod:`espnet3_prefect.server.auth`), read wherever a client
starts: batch jobs and SSH workers get only the file's path
(:data:`~espnet3_prefect._internal.util.CLIENT_FILE_VAR`), read by the Dask worker preload
:mod:`espnet3_prefect.execution.worker_api` as the worker starts.
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import stat
import urllib.parse
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from espnet3_prefect._internal.util import CLIENT_FILE_VAR
from espnet3_prefect.errors import Espnet3PrefectError

CLIENT_FILE_NAME = "api-client.json"


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

        httpx = None
        if self.api_url.startswith("https://"):
            httpx = {"verify": ssl.create_default_context(cafile=self.ssl_cert_file)}  # never unverified
        return SyncPrefectClient(self.api_url, auth_string=self.auth_string, api_key=self.api_key, httpx_settings=httpx)


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
