"""The resume policy: which shards of a test set run again, and when a test set needs no work at all.

A shard is done only when its ``split.N/done`` marker is ours, matches the plan (range) and the
config+code+data fingerprint, and every file it lists still has its checksum. Anything else runs
again: a missing or foreign marker (upstream's empty ``done`` cannot be verified), a changed config,
a damaged file. ``runner.resume: false`` runs everything. A test set needs no cluster at all when,
besides, its last merge is recorded for the same config and its merged outputs are unchanged.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

from espnet3_prefect.disk.layout import UNREPORTED_NAME, StageLayout
from espnet3_prefect.disk.marker import check_marker
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.pipeline.merge import merged_outputs_intact, read_merged_record
from espnet3_prefect.pipeline.plan import (
    Shard,
    default_num_shards,
    duration_shard_count,
    plan_length_order,
    plan_shards,
)
from espnet3_prefect.pipeline.sizing import Sizing, no_lengths
from espnet3_prefect.pipeline.stage import Stage
from espnet3_prefect.pipeline.summary import ShardOutcome, StageSummary


def redo_reason(stage: Stage, shard: Shard) -> str | None:
    """Why ``shard`` must run again, or None when its done marker and files hold: the one record of a
    finished shard (:func:`~espnet3_prefect.disk.marker.check_marker`, against this stage's plan)."""
    return check_marker(stage.layout.shard_dir(shard.index), stage.work.marker_expectation(shard.start, shard.stop))


def shards_to_redo(stage: Stage, shards: list[Shard], log: Callable[[str], None]) -> dict[int, bool]:
    """``{shard index: must run}``; logs why, for a few shards, when it is not just "not run yet"."""
    if not stage.resume:
        log("runner.resume is false: every shard runs")
        return {s.index: True for s in shards}
    redo, reasons = {}, []
    for shard in shards:
        reason = redo_reason(stage, shard)
        redo[shard.index] = reason is not None
        if reason is not None and "no done marker" not in reason:
            reasons.append(reason)
    for reason in reasons[:5]:
        log(f"redoing {reason}")
    if len(reasons) > 5:
        log(f"... and {len(reasons) - 5} more shards for similar reasons")
    log(f"{stage.test_set}: {sum(not r for r in redo.values())} of {len(shards)} shards already done")
    return redo


def remove_stale(layout: StageLayout, n_shards: int) -> list[str]:
    """Remove shard folders beyond the plan (an earlier, larger plan) so a recipe's merge never sees them."""
    removed = []
    for index, path in sorted(layout.existing_shards().items()):
        if index >= n_shards:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def already_complete(stage: Stage, sizing: Sizing | None) -> tuple[StageSummary | None, str]:
    """``(summary, "")`` for a test set that needs no work, else ``(None, why)``; no cluster needed.

    Needs: resume on, a merge record for this config+code, the dataset (``sizing``: built on the
    driver, as ESPnet3 does for its length) of the same size and fingerprint, every shard's marker and
    files intact, and the merged files unchanged.
    """
    started = time.perf_counter()
    record = read_merged_record(stage.layout)
    if not stage.resume:
        return None, "not resumable (runner.resume: false)"
    if not record:
        return None, "no finished merge"
    if record.get("identity_fingerprint") != stage.identity_fingerprint:
        return None, "config or code changed since the last merge"
    if sizing is None:
        return None, "the provider has no build_dataset() to size the test set without a cluster"
    stage = stage.with_dataset(sizing.dataset_id, sizing.lengths_id)
    n_items = sizing.n_items
    if record.get("fingerprint") != stage.work.fingerprint or record.get("n_items") != n_items:
        return None, "the dataset (or its lengths()) changed since the last merge"
    shards = plan_for(stage, n_items, sizing.lengths)
    if len(shards) != record.get("num_shards"):
        return None, "the shard plan changed"
    for shard in shards:
        reason = redo_reason(stage, shard)
        if reason is not None:
            return None, reason
    reason = merged_outputs_intact(stage.layout, record)
    if reason is not None:
        return None, reason
    outcome = ShardOutcome(cached=len(shards), failed=record.get("failed", 0))
    return StageSummary.of(
        stage.test_set,
        shards,
        n_items,
        outcome,
        seconds=time.perf_counter() - started,
        outputs=record.get("outputs", {}),
    ), ""


def plan_for(stage: Stage, n_items: int, lengths=None) -> list[Shard]:
    """The stage's shard plan for ``n_items`` items (``parallel.num_shards``, the count
    ``parallel.shard_duration`` gives, capped by the stage's share of the flow run's task runs, or
    the default count), balanced on the dataset's ``lengths()`` when it has them; with
    ``runner.max_duration`` runs of the whole test set's batches cut by length
    (:func:`~.plan.plan_length_order`, as many shards), or for a runner whose merge cannot be reordered
    the same shards, whose ``forward`` calls get batches cut by length (both keys need the lengths)."""
    batch_size = stage.work.batch_size
    max_duration = stage.work.max_duration
    shard_duration = getattr(stage, "shard_duration", None)
    if (max_duration is not None or shard_duration is not None) and lengths is None:
        raise ConfigError(no_lengths(stage))
    if shard_duration is not None:
        count = duration_shard_count(lengths, batch_size, shard_duration, stage.max_shards)
    else:
        count = stage.num_shards or default_num_shards(n_items, stage.n_workers, batch_size)
    if stage.work.length_order:
        return plan_length_order(stage.test_set, lengths, count, batch_size, max_duration)
    return plan_shards(stage.test_set, n_items, count, batch_size, lengths=lengths, max_duration=max_duration)


def all_complete(stages: list[Stage], sizing_of: Callable[[Stage], Sizing | None] | None = None) -> list[dict] | None:
    """The summaries of ``stages`` when none of them needs any work, checked in this process (no server,
    no cluster), else None. Cheap when there is work: a test set never merged for this config is
    answered before its dataset is built. A dataset that cannot be built here (e.g. data the flow
    prepares first) counts as work: the flow run then says why, or fails with the real error.
    ``sizing_of(stage)``: the test set's sizing (default: built here; a run plan builds it once)."""
    from espnet3_prefect.pipeline.sizing import size_on_driver

    sizing_of = sizing_of or size_on_driver
    if any((stage.layout.run_lock_dir / UNREPORTED_NAME).exists() for stage in stages):
        return None  # an earlier run ended without its server: the flow run records what it left
    summaries = []
    for stage in stages:
        record = read_merged_record(stage.layout)
        if not stage.resume or not record or record.get("identity_fingerprint") != stage.identity_fingerprint:
            return None
        try:
            sizing = sizing_of(stage)
        except Exception:  # noqa: BLE001 - not an answer here; the flow run reports it
            return None
        summary, _ = already_complete(stage, sizing)
        if summary is None:
            return None
        summaries.append(summary.to_dict())
    return summaries
