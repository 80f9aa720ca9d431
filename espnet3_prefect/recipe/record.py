"""A stage's record on disk: the one truth of "this stage is done", as ``split.N/done`` is a shard's.

``<log folder>/<stage>.stage.json`` (the folder ESPnet3 writes ``<stage>.log`` to: ``data_dir`` for
``create_dataset``, ``exp_dir`` for ``train``, ``inference_dir`` for ``infer`` and ``measure``...). It
is written twice, each time whole (write, fsync, rename):

- ``status: started`` when the stage starts, with the inputs it starts from: a record left so is a
  stage that did not finish (killed, crashed, failed); ``train`` resumes from it
  (:mod:`~espnet3_prefect.recipe.resume`);
- ``status: done`` when it returned, with its outputs' manifest (:mod:`~espnet3_prefect.recipe.outputs`)
  and the recipe modules it ran.

It holds no absolute path where a relative one serves (paths are relative to the recipe folder), so
it survives a new flow run, a new Prefect server and a copy of the recipe folder to another machine.

>>> import tempfile
>>> path = Path(tempfile.mkdtemp()) / "train.stage.json"
>>> write_record(path, StageRecord("train", "started", {"config": {"a": 1}}))
>>> read_record(path).status, read_record(path).inputs
('started', {'config': {'a': 1}})
>>> _ = path.write_text("{half"); read_record(path) is None
True
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect.recipe.system import log_dir_of
from espnet3_prefect.recipe.table import RECORD_SUFFIX

STARTED, DONE = "started", "done"


@dataclass
class StageRecord:
    """One stage's record: its inputs (``config``, ``espnet``, ``modules``, ``upstream``), and once done
    its ``outputs`` manifest, their ``digest`` and how long it ran."""

    stage: str
    status: str
    inputs: dict[str, Any]
    outputs: dict[str, dict] = field(default_factory=dict)
    digest: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    seconds: float | None = None
    flow_run_id: str | None = None

    @property
    def done(self) -> bool:
        return self.status == DONE

    def when(self) -> str:
        moment = self.finished_at or self.started_at
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))

    def done_line(self) -> str:
        """``done 2026-11-28 13:40:16 in 15.0 s``: when this record's run finished, and how long it took."""
        took = f" in {self.seconds:.1f} s" if self.seconds is not None else ""
        return f"done {self.when()}{took}"


def record_path(system: Any, stage: str) -> Path:
    """``<stage's log folder>/<stage>.stage.json``."""
    return log_dir_of(system, stage) / f"{stage}{RECORD_SUFFIX}"


def read_record(path: Path) -> StageRecord | None:
    """The record at ``path``; None when there is none or it cannot be read (then the stage runs)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return StageRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def write_record(path: Path, record: StageRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(asdict(record), indent=1, sort_keys=True) + "\n")


__all__ = ["DONE", "STARTED", "StageRecord", "read_record", "record_path", "write_record"]
