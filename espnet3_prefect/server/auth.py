"""The Prefect API served beyond loopback: its basic-auth credential, and which client file a run
hands the URL and credential to every client with (the file's format and reader are
:mod:`espnet3_prefect.disk.client_file`'s). Where the server listens is :mod:`espnet3_prefect.server.host`'s.

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
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from espnet3_prefect._internal.util import CLIENT_FILE_VAR
from espnet3_prefect.disk.client_file import (
    ClientCredentials,
    CredentialFileError,
    client_file,
    read_client_file,
    write_client_file,
)
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.server.state_home import CLIENT_HOME_DIR

AUTH_USER = "espnet3"


def new_auth_string() -> str:
    """A fresh basic-auth credential ``espnet3:<43 random URL-safe characters>``.

    >>> user, secret = new_auth_string().split(":"); user, len(secret)
    ('espnet3', 43)
    """
    return f"{AUTH_USER}:{secrets.token_urlsafe(32)}"


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
    """``creds`` (a :class:`~espnet3_prefect.disk.client_file.ClientCredentials`, None: nothing to add) in
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
