"""``watch-checkpoints``: poll an experiment folder and send one event per complete, new checkpoint.

A file matching a pattern is complete when its size and mtime have not changed for ``settle_s``, or
at once when it is a zip archive that ends with its own end record (``torch.save``'s format: the
writer has closed it; a file renamed into place by the training framework is seen that way too).
A half-written file is never sent. Its content hash decides whether it is new: a copy, a re-save
of the same weights, ``last.ckpt`` beside its twin, and everything sent before a restart (the state
file, :class:`~espnet3_prefect.checkpoints.events.EmittedState`) are not sent again.

``mode="all"`` sends every new checkpoint, oldest first; ``mode="latest"`` sends only the newest of
those complete at one poll (the others are recorded as passed over, never sent later), and marks its
events ``latest``: an ``evaluate`` run they start that is still queued when a newer one is queued
behind it passes over (only the newest is evaluated).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from espnet3_prefect._internal.atomic import file_digest
from espnet3_prefect.checkpoints.checkpoint import checkpoint_info, describe_checkpoint, parse_name, zip_complete
from espnet3_prefect.checkpoints.events import EmittedState
from espnet3_prefect.errors import ConfigError

log = logging.getLogger("espnet3_prefect.watch")
DEFAULT_PATTERNS = ("**/*.ckpt", "**/*.pth", "**/*.pt")
MODES = ("all", "latest")


@dataclass
class _Seen:
    signature: tuple
    since: float
    sha256: str | None = None


@dataclass
class Watcher:
    """Polls ``exp_dir``; :meth:`poll` sends what became complete and new since the last poll."""

    exp_dir: Path
    state: EmittedState
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    mode: str = "all"
    settle_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    seen: dict[Path, _Seen] = field(default_factory=dict)
    reported: set = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode: {self.mode!r} is not one of {', '.join(MODES)}")
        if not self.exp_dir.is_dir():
            raise ConfigError(f"exp dir {self.exp_dir}: no such folder")
        self.exp_dir = self.exp_dir.resolve()

    def candidates(self) -> list[Path]:
        found = set()
        for pattern in self.patterns:
            for path in self.exp_dir.glob(pattern):
                if path.is_file() and not any(part.startswith(".") for part in path.relative_to(self.exp_dir).parts):
                    found.add(path)
        return sorted(found)

    def complete(self) -> list[tuple[Path, str]]:
        """The (path, sha256) of every matching file that is complete now."""
        now = self.clock()
        ready = []
        present = self.candidates()
        for gone in set(self.seen) - set(present):
            del self.seen[gone]
        for path in present:
            try:
                st = path.stat()
            except OSError:
                continue
            signature = (st.st_size, st.st_mtime_ns, st.st_ino)
            entry = self.seen.get(path)
            if entry is None or entry.signature != signature:
                entry = self.seen[path] = _Seen(signature, now)
            if now - entry.since < self.settle_s and not zip_complete(path):
                continue
            if entry.sha256 is None:
                digest = file_digest(path)
                if digest["bytes"] != signature[0]:  # it changed while we hashed it: next poll
                    del self.seen[path]
                    continue
                entry.sha256 = digest["sha256"]
            ready.append((path, entry.sha256))
        # the oldest file of a content names it (not a copy made later)
        return sorted(ready, key=lambda item: (self.seen[item[0]].signature[1], str(item[0])))

    def poll(self) -> list[dict]:
        """One look at the folder; returns the events sent."""
        new: dict[str, Path] = {}
        for path, sha in self.complete():
            known = self.state.known(sha)
            if known is not None:
                if known.get("path") != str(path) and (path, sha) not in self.reported:
                    log.info("%s: same content as %s (already %s): not sent", path, known.get("path"), known["state"])
                self.reported.add((path, sha))
                continue
            new.setdefault(sha, path)
        if not new:
            return []
        infos = sorted((checkpoint_info(p) for p in new.values()), key=_age)
        if self.mode == "latest" and len(infos) > 1:
            for older in infos[:-1]:
                self.state.pass_over(older, infos[-1])
                log.info("%s: passed over (--mode latest): %s is newer", older["name"], infos[-1]["name"])
            infos = infos[-1:]
        sent = self.state.emit(infos, self.exp_dir, latest=self.mode == "latest")
        for info in infos:
            log.info("sent %s for %s", "espnet3.checkpoint.saved", describe_checkpoint(info))
        return sent

    def run(self, poll_s: float = 1.0, stop: Callable[[], bool] = lambda: False) -> None:
        self.state.flush_pending()
        while not stop():
            self.poll()
            time.sleep(poll_s)


def _age(info: dict) -> tuple:
    """Oldest first: by step, then epoch, then mtime, then name."""
    numbers = parse_name(info["name"])
    step = info.get("step") if info.get("step") is not None else numbers["step"]
    epoch = info.get("epoch") if info.get("epoch") is not None else numbers["epoch"]
    return (step if step is not None else -1, epoch if epoch is not None else -1, info["mtime"], info["name"])
