"""The checkpoint event: built, sent to the Prefect server, confirmed there, and remembered.

One event per checkpoint content: ``espnet3.checkpoint.saved`` on the resource
``espnet3.checkpoint.<sha256>``, its payload the checkpoint's path, hash, epoch and step (what the
``evaluate/checkpoint`` deployment's trigger templates its parameters from). On a self-hosted server
the client sends events itself (webhooks are Prefect Cloud's); :func:`send` opens Prefect's events
client, sends, then reads the events back from the server until each one is there.

:class:`EmittedState` is the record that makes it once per content: a JSON file (default
``<exp_dir>/.espnet3-checkpoints.json``) of the hashes already sent, written before (``pending``,
with the event id) and after (``emitted``) each send, under an exclusive lock. A sender killed
between the two sends the same event id again; the server's triggers skip an event id they have
seen, so the run is not doubled.

    import espnet3_prefect
    espnet3_prefect.checkpoint_saved("exp/asr/checkpoints/epoch=3-step=1200.ckpt")
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect.disk.layout import CHECKPOINT_STATE_NAME
from espnet3_prefect.errors import Espnet3PrefectError

EVENT_NAME = "espnet3.checkpoint.saved"
RESOURCE_PREFIX = "espnet3.checkpoint."
STATE_FILE_NAME = CHECKPOINT_STATE_NAME
CONFIRM_TIMEOUT_S = 60.0


def resource_id(sha256: str) -> str:
    """The event's resource: the checkpoint's content.

    >>> resource_id("ab" * 32)[:22]
    'espnet3.checkpoint.aba'
    """
    return f"{RESOURCE_PREFIX}{sha256}"


def event_fields(info: dict, exp_dir: Path | None, event_id: str, latest: bool = False) -> dict[str, Any]:
    """The event's fields for :class:`prefect.events.Event` (and what the state file keeps). ``latest``:
    the sender wants only the newest checkpoint evaluated (a queued run passes over for a newer one)."""
    payload = {k: info.get(k) for k in ("path", "name", "sha256", "bytes", "epoch", "step")}
    payload.update(exp_dir=str(exp_dir) if exp_dir else None, latest=bool(latest))
    resource = {
        "prefect.resource.id": resource_id(info["sha256"]),
        "prefect.resource.name": info["name"],
        "espnet3.checkpoint.path": info["path"],
    }
    if exp_dir:
        resource["espnet3.exp-dir"] = str(exp_dir)
    return {"id": event_id, "event": EVENT_NAME, "resource": resource, "payload": payload}


def send(fields: list[dict], confirm_timeout_s: float = CONFIRM_TIMEOUT_S) -> None:
    """Send the events to the server ``PREFECT_API_URL`` names (with its auth) and wait until the
    server lists every one; raises :class:`Espnet3PrefectError` if it does not in time."""
    if not fields:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the usual case: no event loop in this thread
        asyncio.run(_send(fields, confirm_timeout_s))
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:  # called from async code (a notebook): its own loop, in a thread
        pool.submit(asyncio.run, _send(fields, confirm_timeout_s)).result()


async def _send(fields: list[dict], confirm_timeout_s: float) -> None:
    from prefect.client.orchestration import get_client
    from prefect.events import Event
    from prefect.events.clients import PrefectEventsClient
    from prefect.events.filters import EventFilter, EventIDFilter, EventOccurredFilter
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise Espnet3PrefectError(
            "no Prefect server to send the checkpoint event to: set PREFECT_API_URL "
            "(or run `espnet3-prefect deploy-local`)"
        )
    events = [Event(**{**f, "id": uuid.UUID(f["id"]), "occurred": datetime.now(UTC)}) for f in fields]
    wanted = {e.id for e in events}
    deadline = time.monotonic() + confirm_timeout_s
    async with get_client() as client:
        window = EventOccurredFilter(since=datetime.now(UTC) - timedelta(days=1))
        while True:
            async with PrefectEventsClient() as events_client:
                for event in events:
                    if event.id in wanted:
                        await events_client.emit(event)
            resend_at = time.monotonic() + 15
            while time.monotonic() < min(resend_at, deadline):
                for chunk in _chunks(sorted(wanted, key=str), 40):  # the API answers 50 events at most
                    page = await client.read_events(EventFilter(id=EventIDFilter(id=chunk), occurred=window), limit=50)
                    wanted -= {e.id for e in page.events}
                if not wanted:
                    return
                await asyncio.sleep(0.5)
            if time.monotonic() >= deadline:
                raise Espnet3PrefectError(
                    f"the server did not list checkpoint event(s) {sorted(map(str, wanted))} "
                    f"within {confirm_timeout_s:.0f} s of sending them"
                )


def _chunks(items: list, size: int) -> list[list]:
    """``items`` in lists of ``size``.

    >>> _chunks([1, 2, 3], 2)
    [[1, 2], [3]]
    """
    return [items[i : i + size] for i in range(0, len(items), size)]


class EmittedState:
    """The hashes already sent for an experiment folder (``with EmittedState(path) as state:``)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.data: dict[str, dict] = {"emitted": {}, "pending": {}, "superseded": {}}
        self._lock_fd: int | None = None

    def __enter__(self) -> EmittedState:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Espnet3PrefectError(
                f"{self.path}: another checkpoint watcher or sender holds it "
                f"({self.path}.lock); one at a time per state file"
            ) from None
        self._lock_fd = fd
        self.load()
        return self

    def __exit__(self, *exc) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def load(self) -> None:
        if self.path.is_file():
            try:
                loaded = json.loads(self.path.read_text())
            except ValueError as exc:
                raise Espnet3PrefectError(f"{self.path}: not a checkpoint state file ({exc})") from None
            for key in self.data:
                self.data[key] = dict(loaded.get(key) or {})

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=1, sort_keys=True))

    def known(self, sha256: str) -> dict | None:
        """The record of a hash already sent, being sent, or passed over (``latest``), else None."""
        for key in ("emitted", "pending", "superseded"):
            if sha256 in self.data[key]:
                return {"state": key, **self.data[key][sha256]}
        return None

    def emit(self, infos: list[dict], exp_dir: Path | None, latest: bool = False) -> list[dict]:
        """Send one event per checkpoint of ``infos`` not known yet (in order); returns the events sent."""
        fresh = [info for info in infos if self.known(info["sha256"]) is None]
        fields = [event_fields(info, exp_dir, str(uuid.uuid4()), latest) for info in fresh]
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        for f in fields:
            self.data["pending"][f["payload"]["sha256"]] = {
                "event_id": f["id"],
                "path": f["payload"]["path"],
                "fields": f,
                "since": stamp,
            }
        self.save()
        self.flush_pending()
        return fields

    def flush_pending(self) -> None:
        """Send what a killed sender left pending (same event ids), then mark it emitted."""
        pending = self.data["pending"]
        if not pending:
            return
        send([record["fields"] for record in pending.values()])
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        for sha, record in list(pending.items()):
            self.data["emitted"][sha] = {"event_id": record["event_id"], "path": record["path"], "emitted": stamp}
            del pending[sha]
        self.save()

    def pass_over(self, info: dict, newer: dict) -> None:
        """``latest`` mode: ``info`` is not sent, ``newer`` is."""
        self.data["superseded"][info["sha256"]] = {"path": info["path"], "by": newer["sha256"]}


def state_path(exp_dir: Path, state_file: str | Path | None = None) -> Path:
    return Path(state_file).expanduser().resolve() if state_file else Path(exp_dir).resolve() / STATE_FILE_NAME


def prefect_settings(creds):
    """Prefect's settings pointed at the API ``creds`` (:class:`~espnet3_prefect.disk.client_file.ClientCredentials`)
    reach, with its auth and, for ``https://``, its certificate, for this process, for a ``with``."""
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_SSL_CERT_FILE,
        PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
        PREFECT_API_URL,
        temporary_settings,
    )

    updates: dict = {PREFECT_API_URL: creds.api_url}
    if creds.auth_string:
        updates[PREFECT_API_AUTH_STRING] = creds.auth_string
    if creds.ssl_cert_file:
        updates.update({PREFECT_API_SSL_CERT_FILE: creds.ssl_cert_file, PREFECT_API_TLS_INSECURE_SKIP_VERIFY: False})
    return temporary_settings(updates=updates)
