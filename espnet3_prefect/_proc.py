"""The one helper for subprocess calls: logs the command, raises with its output."""

from __future__ import annotations

import logging
import shlex
import subprocess
from typing import Sequence

from .errors import Espnet3PrefectError

log = logging.getLogger("espnet3_prefect")


class CommandError(Espnet3PrefectError, RuntimeError):
    """A command exited non-zero or timed out; the message holds the tail of its output."""


def run_command(cmd: Sequence[str], *, timeout_s: float = 60, check: bool = True,
                env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd``, log it, and raise :class:`CommandError` with its output when it fails.

    >>> run_command(["echo", "hi"]).stdout
    'hi\\n'
    """
    text = shlex.join(cmd)
    log.debug("running: %s", text)
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise CommandError(f"command timed out after {timeout_s} s: {text}") from None
    except FileNotFoundError:
        raise CommandError(f"command not found: {cmd[0]} (running: {text})") from None
    if check and proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-2000:]
        raise CommandError(f"command failed with exit code {proc.returncode}: {text}: {' '.join(tail.split())}")
    return proc
