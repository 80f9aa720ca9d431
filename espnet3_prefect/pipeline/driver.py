"""The pipeline driver: one stage, from its plan to its summary, the same for every way a stage runs.

build env -> plan shards -> drop shard folders beyond the plan, write the manifest -> which shards run
again (their done markers) -> run those shards (each marks itself done) -> merge -> summary (and, for
the infer stage, the test set's ``.throughput.json``: :mod:`espnet3_prefect.pipeline.throughput`).

The done marker is the one answer to "is this shard done?": a shard whose marker and files are intact
is never handed to the executor (no task, no round trip); the driver counts it as cached, with the
items its marker records as skipped.

Where the steps run is an :class:`Executor`'s business: the flows' executor
(:class:`espnet3_prefect.flows.dispatch.DaskExecutor`) submits Prefect tasks to the ``DaskTaskRunner``
built from the ``parallel`` block; :class:`espnet3_prefect.pipeline.in_process.InProcessExecutor` runs
them in this process (``runner(indices)`` with no ``parallel`` block, as ESPnet3's local mode). The flow
``infer`` drives each test set through :func:`drive_stage`, the flow ``run-runner`` and the in-process
path drive a prepared runner job through it.

>>> import tempfile
>>> from pathlib import Path
>>> from espnet3_prefect import BaseRunner
>>> from espnet3_prefect.pipeline.in_process import InProcessExecutor
>>> from espnet3_prefect.pipeline.runner_job import prepare_job
>>> class Square(BaseRunner):  # batch_size 2: forward gets a batch of indices
...     @staticmethod
...     def forward(batch, **env):
...         return [i * i for i in batch]
...     def merge(self, shard_dirs):
...         return len(shard_dirs)
>>> job = prepare_job(Square(None, 2, tempfile.mkdtemp()), range(5), None)
>>> summary, merged = drive_stage(job.stage, InProcessExecutor(job.runner), shards=job.shards)
>>> (summary.shards, summary.shards_run, summary.items, merged)
(3, 3, 5, 3)
>>> drive_stage(job.stage, InProcessExecutor(job.runner), shards=job.shards)[0].shards_cached
3
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from espnet3_prefect.pipeline.merge import remove_merged, skipped_items
from espnet3_prefect.pipeline.plan import Shard, write_manifest
from espnet3_prefect.pipeline.resume import plan_for, remove_stale, shards_to_redo
from espnet3_prefect.pipeline.sizing import Sizing
from espnet3_prefect.pipeline.stage import Stage
from espnet3_prefect.pipeline.summary import ShardOutcome, StageSummary, audio_seconds
from espnet3_prefect.pipeline.throughput import of_summary
from espnet3_prefect.pipeline.throughput import write as write_throughput


class Executor(Protocol):
    """Where a stage's steps run. ``records_merge``: the merge writes the finished test set's commit
    record (the infer stage's outputs); ``log`` is the logger the driver reports on."""

    records_merge: bool
    log: Any

    def build_env(self, stage: Stage) -> dict:
        """Build the provider env wherever shards will run; returns at least ``{"workers": n}`` and, for
        a stage planned from its dataset, ``{"n_items": ..., "dataset_id": ...}``."""

    def run_shards(self, stage: Stage, shards: list[Shard]) -> ShardOutcome:
        """Run ``shards`` (each marks itself done): only those the done markers say must run; the driver
        counts the others itself."""

    def merge(self, stage: Stage, shards: list[Shard], n_items: int) -> tuple[Any, dict[str, str]]:
        """The runner's ``merge`` over every shard folder: ``(what it returned, merged outputs by name)``."""

    def forget_env(self, stage: Stage) -> None:
        """Free the env (and its model) wherever it was built."""


def drive_stage(
    stage: Stage, executor: Executor, *, shards: list[Shard] | None = None, sizing: Sizing | None = None
) -> tuple[StageSummary, Any]:
    """Run one stage; returns its summary and what the runner's ``merge`` returned.

    ``shards``: the plan, when it is known without the dataset (a runner job's index list); without it
    the env is built first and the plan comes from the dataset's size (``sizing``, when the driver sized
    the dataset itself, also gives its ``lengths()`` to balance the shards on). With a plan given, the
    env is built only when some shard runs; a stage whose shards are all done starts no work at all.
    """
    log = executor.log
    started = time.perf_counter()
    built: dict | None = None
    if shards is None:
        built = executor.build_env(stage)
        if sizing is not None:
            built = {**built, "n_items": sizing.n_items, "dataset_id": sizing.dataset_id}
        stage = stage.with_dataset(built.get("dataset_id"), sizing.lengths_id if sizing else None)
        lengths = sizing.lengths if sizing is not None else None
        shards = plan_for(stage, built["n_items"], lengths)
        if lengths is not None and stage.shard_duration is not None:
            log.info(
                "%s: %d shards of about %.6g each by the dataset's lengths() (parallel.shard_duration=%g, "
                "at most %d shards), handed out longest first",
                stage.test_set,
                len(shards),
                float(lengths.sum()) / len(shards),
                stage.shard_duration,
                stage.max_shards,
            )
        elif lengths is not None:
            log.info(
                "%s: %d shards balanced on the items' lengths from %s (total %.6g)",
                stage.test_set,
                len(shards),
                sizing.source,
                float(lengths.sum()),
            )
    n_items = sum(s.n_items for s in shards)
    redo = _prepare_folder(stage, shards, log, remove_merged_outputs=executor.records_merge)
    to_run = [s for s in shards if redo[s.index]]
    if to_run:
        if built is None:
            built = executor.build_env(stage)
        outcome = executor.run_shards(stage, to_run)
    else:
        log.info("%s: all %d shards done and verified: nothing to run", stage.test_set, len(shards))
        outcome = ShardOutcome()
    done = [stage.layout.shard_dir(s.index) for s in shards if not redo[s.index]]
    outcome.cached += len(done)
    outcome.failed += skipped_items(done)
    merged, outputs = executor.merge(stage, shards, n_items)
    if built is not None:
        executor.forget_env(stage)
    items_run = sum(s.n_items for s in shards if redo.get(s.index)) if executor.records_merge else None
    summary = StageSummary.of(
        stage.test_set,
        shards,
        n_items,
        outcome,
        seconds=time.perf_counter() - started,
        outputs=outputs,
        workers=(built or {}).get("workers", 0),
        items_run=items_run,
        lengths=_lengths_said(sizing, outcome),
        generated_s=audio_seconds(outputs) if executor.records_merge else None,
    )
    if executor.records_merge and outcome.run:
        _write_throughput(stage, summary, log)
    return summary, merged


def _lengths_said(sizing: Sizing | None, outcome: ShardOutcome) -> dict[str, Any] | None:
    """Where the items' lengths came from: the driver's (``lengths()``, or files under ``max_duration``),
    else the shards' own reading of their audio headers, else None."""
    if sizing is not None and sizing.lengths is not None:
        return {"source": sizing.source, "unit": sizing.unit}
    unit = (outcome.timing or {}).get("lengths_unit")
    return {"source": "audio headers (read by each shard)", "unit": unit} if unit else None


def _write_throughput(stage: Stage, summary: StageSummary, log: Any) -> None:
    """``<test>/.throughput.json`` of the shards that ran (never read by upstream; a failed write is said,
    never fatal: the outputs are merged already)."""
    data = of_summary(summary.to_dict())
    if data is None:
        return
    extra = {
        "lengths_source": (summary.lengths or {}).get("source"),
        "batch_size": stage.work.batch_size,
        "max_duration": stage.work.max_duration,
        "shards_run": summary.shards_run,
    }
    try:
        write_throughput(stage.layout.throughput, stage.test_set, data, extra)
    except OSError as exc:
        log.warning("%s: %s not written: %s", stage.test_set, stage.layout.throughput, exc)


def _prepare_folder(
    stage: Stage, shards: list[Shard], log: logging.Logger | Any, *, remove_merged_outputs: bool
) -> dict[int, bool]:
    """The stage's folder made to match the plan: shard folders beyond it removed, the manifest written,
    and ``{shard index: must run}`` from the done markers; the recorded merged outputs of a stage that
    runs again are removed (they no longer match its shards)."""
    layout = stage.layout
    removed = remove_stale(layout, len(shards))
    if removed:
        log.info("%s: removed shard folders beyond the plan: %s", stage.test_set, ", ".join(removed[:10]))
    layout.root.mkdir(parents=True, exist_ok=True)
    write_manifest(
        layout.manifest, str(getattr(stage.runner, "output_dir", layout.output_dir)), layout.shard_subdir, shards
    )
    redo = shards_to_redo(stage, shards, log.info)
    if remove_merged_outputs and any(redo.values()):
        stale = remove_merged(layout)
        if stale:
            log.info("%s: removed stale merged outputs %s", stage.test_set, ", ".join(stale))
    return redo
