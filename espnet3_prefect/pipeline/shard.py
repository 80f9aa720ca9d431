"""Run shard: drive a runner *class* over one shard through ESPnet3's public hooks only.

Any class with a static or class-level ``forward`` works: the real ``espnet3`` runners, ours, or a
plain class with the right methods. Where the class has upstream's ``init_state`` /
``reduce_state`` / ``finalize_state`` they are called (a subclass may override them); otherwise
their upstream behaviour is applied around its ``open_writers`` / ``write_record`` /
``close_writers``. The hooks see the final ``split.N`` folder and the env upstream gives them
(the provider env plus ``output_dir``, ``shard_subdir`` when set, and ``shard_id``).

Around the hooks, and never changing what they receive: the shard lock, per-item error isolation
(``on_error: skip`` re-runs a failing batch one item at a time), the done marker with checksums
written last, prefetch (the next units' ``dataset[i]`` read in a background thread while ``forward``
runs, see :mod:`espnet3_prefect.pipeline.prefetch`) and where the time goes (:class:`~.prefetch.Timing`,
carried in the shard's summary and its marker).

With ``runner.max_duration`` the shard's ``forward`` calls get batches cut by length, and the results
reach the hooks in dataset order, grouped as upstream's batches, or, for a shard of the whole test set in
length order, batch by batch as they run, the marker recording which item each ``utt_id`` is (``keys``,
what the merge puts the lines back in dataset order by; :mod:`espnet3_prefect.pipeline.duration`).
When the items' lengths are known, the summary's ``padding`` says how much of the batches was padding.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from espnet3_prefect.config.runner_keys import DEFAULT_PREFETCH
from espnet3_prefect.disk.layout import FAILURES_NAME, SHARD_LOCK_NAME, StageLayout
from espnet3_prefect.disk.marker import remove_marker, write_marker
from espnet3_prefect.errors import (
    ConfigError,
    DiskFullError,
    ItemError,
    describe,
    disk_full,
    is_retryable,
    named,
    no_space,
)
from espnet3_prefect.espnet3.envcall import accepts, call_with_env
from espnet3_prefect.execution.backends import current_job_id
from espnet3_prefect.pipeline.duration import InOrder, padding
from espnet3_prefect.pipeline.gpu_busy import GpuBusy
from espnet3_prefect.pipeline.lengths import SECONDS, shard_seconds
from espnet3_prefect.pipeline.lock import release_shard_lock, take_shard_lock
from espnet3_prefect.pipeline.oom import Halving, halves, is_out_of_memory
from espnet3_prefect.pipeline.plan import Shard, Unit
from espnet3_prefect.pipeline.prefetch import Prefetcher, Timing, make_view
from espnet3_prefect.pipeline.runner_hooks import RunnerHooks, close_quietly
from espnet3_prefect.pipeline.throughput import ShardStats


def process_shard(
    runner_cls: type,
    shard: Shard,
    env: dict,
    layout: StageLayout,
    *,
    on_error: str = "fail",
    idx_key: str = "utt_id",
    marker: dict | None = None,
    flow_run_id: str | None = None,
    allow_overwrite_lock: bool = False,
    log: Callable[[str], Any] | None = None,
    prefetch: int = DEFAULT_PREFETCH,
) -> dict:
    """Run ``shard`` into ``layout.shard_dir(shard.index)`` and mark it done; return a small summary.

    ``marker`` is what the done marker records besides the range and checksums (fingerprint, ...).
    ``prefetch``: units read ahead of ``forward`` (0: off). The summary and the marker carry the
    shard's counts (:class:`~.throughput.ShardStats`; the marker without ``pid``) and ``timing`` (see
    :class:`~.prefetch.Timing`); the summary also ``padding`` when the shard knows its items' lengths
    (the plan's, else its audio files' headers: then ``lengths_unit: "s"``):
    ``{"batches", "real", "padded"}`` summed over the batches planned (real / padded is the padding
    efficiency; a batch re-run item by item under ``on_error: skip`` counts as planned);
    ``gpu_busy`` where a GPU was sampled (:mod:`~.gpu_busy`); ``oom_halvings`` under ``max_duration``.
    """
    shard_dir = layout.shard_dir(shard.index)
    try:
        return _process_shard(
            runner_cls, shard, env, layout, on_error, idx_key, marker, flow_run_id, allow_overwrite_lock, log, prefetch
        )
    except Exception as exc:
        full = no_space(exc)
        if full is None or isinstance(exc, DiskFullError):
            raise
        raise disk_full(full, shard_dir) from exc


def _process_shard(
    runner_cls, shard, env, layout, on_error, idx_key, marker, flow_run_id, allow_overwrite_lock, log, prefetch
) -> dict:
    shard_dir = layout.shard_dir(shard.index)
    # Taken whole or not at all: a full disk leaves no lock, and the lock it leaves names its holder.
    took_over = take_shard_lock(layout.shard_lock(shard.index), flow_run_id, allow_overwrite_lock)
    if took_over and log:
        log(f"{shard_dir.name}: took over its lock: {took_over}")
    started = time.perf_counter()
    timing = Timing()
    try:  # whatever fails from here on, the lock goes and no marker is written
        remove_marker(shard_dir)
        _clear(shard_dir)
        units = shard.forward_units()
        halving = None if shard.max_duration is None else Halving(shard.index, log)
        keys: list | None = [] if shard.length_order else None
        with GpuBusy() as gpu:  # sampled only where NVML and a GPU are there
            failures = drive(
                runner_cls,
                units,
                env,
                shard.index,
                on_error=on_error,
                idx_key=idx_key,
                prefetch=prefetch,
                timing=timing,
                log=log,
                hand_over=None if shard.max_duration is None else list(shard.units()),
                halving=halving,
                keys=keys,
            )
        committing = time.perf_counter()
        if failures:
            try:
                (shard_dir / FAILURES_NAME).write_text(
                    "".join(json.dumps(f, sort_keys=True) + "\n" for f in failures), encoding="utf-8"
                )
            except OSError as exc:
                named(exc, shard_dir / FAILURES_NAME)
                raise
        seconds = round(time.perf_counter() - started, 4)
        stats = ShardStats(shard.n_items, len(failures), seconds, host=socket.gethostname(), job_id=current_job_id())
        record = {
            **(marker or {}),
            "test_set": shard.test_set,
            "index": shard.index,
            "start": shard.start,
            "stop": shard.stop,
            **stats.to_dict(),
            **({"keys": keys} if keys is not None else {}),
        }
        timing.write_s += time.perf_counter() - committing
        marking = time.perf_counter()
        write_marker(shard_dir, {**record, "timing": timing.to_dict()})
        timing.write_s += time.perf_counter() - marking  # checksums + fsyncs: in the summary, not in the marker
    finally:
        release_shard_lock(layout.shard_lock(shard.index))
    items = shard.items()
    lengths, extra = shard.item_lengths(), {}
    if lengths is None:  # the driver knew none: this shard's audio headers, for the report only
        lengths = _report_seconds(env.get("dataset"), items, shard_dir.name, log)
        if lengths is not None:
            extra = {"lengths_unit": SECONDS}
    if lengths is not None:  # the batches planned; once a batch was halved, the batches that ran
        ran = halving.ran if halving is not None and halving.count else units
        extra["padding"] = padding(ran, dict(zip(items, lengths)))
    stats = replace(stats, seconds=round(time.perf_counter() - started, 4), pid=os.getpid())
    if halving is not None:
        extra["oom_halvings"] = halving.count
    if gpu.result() is not None:
        extra["gpu_busy"] = gpu.result()
    return {
        **{k: v for k, v in shard.to_dict().items() if k != "lengths"},
        **extra,
        **stats.to_dict(),
        "timing": timing.to_dict(),
    }


def _report_seconds(dataset: Any, items: Any, name: str, log: Callable[[str], Any] | None) -> list[float] | None:
    """The items' seconds from their audio headers (:func:`~.lengths.shard_seconds`), or None; a file that
    cannot be read leaves the shard's figures out (said once), never the shard."""
    try:
        return shard_seconds(dataset, items)
    except Exception as exc:  # noqa: BLE001 - the report's business only; the outputs are committed
        if log is not None:
            log(f"{name}: audio lengths not read for the report ({describe(exc)}); no RTFx from this shard")
        return None


def _clear(shard_dir: Path) -> None:
    """Empty the shard folder (a previous attempt's files must not survive into this one's marker)."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    for child in shard_dir.iterdir():
        if child.name == SHARD_LOCK_NAME:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def drive(
    runner_cls: type,
    units: Iterable[Unit],
    env: dict,
    shard_id: int,
    *,
    on_error: str = "fail",
    idx_key: str = "utt_id",
    prefetch: int = DEFAULT_PREFETCH,
    timing: Timing | None = None,
    log: Callable[[str], Any] | None = None,
    hand_over: list[Unit] | None = None,
    halving: Halving | None = None,
    keys: list | None = None,
) -> list[dict]:
    """``init_state`` -> ``forward`` + ``reduce_state`` per unit -> ``finalize_state``.

    ``hand_over`` (batches by duration): the results of ``units`` (any order) reach ``reduce_state``
    in the order and grouping of these units instead (:class:`~.duration.InOrder`); a batch that runs
    out of memory is then split in halves (``halving``, :mod:`~.oom`; ignored without ``hand_over``).
    ``keys`` (with ``hand_over``): filled with ``[index, utt_id]`` for each result handed on.

    With ``prefetch`` > 0 and a dataset that can have a view (:mod:`espnet3_prefect.pipeline.prefetch`),
    ``forward`` gets that view as ``dataset`` while the next ``prefetch`` units are read ahead; every
    other hook gets ``env`` as it is. ``timing`` (when given) is filled in.
    Returns the items skipped under ``on_error: skip`` (each ``{"idx", "item", "error"}``).
    """
    hooks = RunnerHooks(runner_cls)
    timing = timing if timing is not None else Timing()
    failures: list[dict] = []
    units = list(units)
    clock = time.perf_counter
    began = clock()
    state = hooks.init(shard_id, env)
    timing.write_s += clock() - began
    prefetcher = _prefetcher(hooks.forward, env, units, prefetch, log)
    forward_env, label_env = env, env
    if prefetcher is not None:
        forward_env, label_env = {**env, "dataset": prefetcher.view}, {**env, "dataset": _Peek(prefetcher)}
        timing.prefetch = prefetch
    name = getattr(runner_cls, "__qualname__", "runner")
    in_order = None if hand_over is None else InOrder(hand_over, name, keys, idx_key)
    if in_order is None:
        halving = None  # upstream's batches: an out-of-memory error fails them as upstream's infer() would
    calls = _ForwardCalls(hooks.forward, forward_env, on_error, failures, idx_key, label_env, halving)
    try:
        try:
            for position, unit in enumerate(units):
                stalled = 0.0
                if prefetcher is not None:
                    prefetcher.advance(position)
                    stalled = prefetcher.inline_wait_s
                began = clock()
                results = calls.run(unit) if in_order is None else calls.run_in_order(unit, in_order)
                reduced = clock()
                timing.forward_s += reduced - began - (prefetcher.inline_wait_s - stalled if prefetcher else 0.0)
                for result in results:
                    state = hooks.reduce(state, result, shard_id, env)
                timing.write_s += clock() - reduced
        finally:
            if prefetcher is not None:
                prefetcher.close()
                timing.load_s, timing.wait_s = prefetcher.load_s, prefetcher.stall_s
    except BaseException:
        close_quietly(state.get("_writers") if isinstance(state, dict) else None)
        raise
    if in_order is not None and not in_order.finished:  # never close a shard with results held back
        close_quietly(state.get("_writers") if isinstance(state, dict) else None)
        raise RuntimeError(f"shard {shard_id}: results of items {in_order.groups[in_order.next]} never came back")
    began = clock()
    hooks.finalize(state, shard_id, env)
    timing.write_s += clock() - began
    return failures


def _prefetcher(
    forward: Callable, env: dict, units: list, depth: int, log: Callable[[str], Any] | None
) -> Prefetcher | None:
    """A prefetcher when it is on, ``forward`` takes ``dataset`` and the env's dataset can have a view."""
    if depth <= 0 or len(units) < 2 or "dataset" not in env:
        return None
    try:
        names, takes_all = accepts(forward)
    except (TypeError, ValueError):
        return None
    if not takes_all and "dataset" not in names:
        return None
    view = make_view(env["dataset"])
    return None if view is None else Prefetcher(env["dataset"], units, depth, view, warn=log)


class _Peek:
    """``dataset[i]`` for error labels, serialized with the prefetch thread's reads."""

    def __init__(self, prefetcher: Prefetcher):
        self._prefetcher = prefetcher

    def __getitem__(self, key: Any) -> Any:
        return self._prefetcher.peek(key)


@dataclass
class _ForwardCalls:
    """``forward`` called on a shard's units, with what every call shares: the env it is given, the
    ``on_error`` policy and the failures list it fills, where error messages read the utterance ids
    (``label_env``, under ``idx_key``) and, for batches by duration, the halving of a batch that runs
    out of memory (``halving``; None: upstream's batches, an OOM fails as any error does)."""

    forward: Callable
    env: dict
    on_error: str
    failures: list
    idx_key: str
    label_env: dict
    halving: Halving | None = None

    def run(self, unit: Unit) -> list:
        """``[result]`` for one unit; under ``on_error: skip`` a failing batch is retried item by item
        (as one-item batches, the shape ``forward`` expects) and failing items are left out."""
        return [result for _, result in self.parts(unit, halving=None)]

    def run_in_order(self, unit: Unit, in_order: InOrder) -> list:
        """:meth:`run` for batches by duration: the unit's results (per item) and failures go to
        ``in_order``; what it can hand on now, in dataset order, is returned. A batch that runs out of
        memory is split in halves."""
        known = len(self.failures)
        for part, result in self.parts(unit, self.halving):
            in_order.add(part, result)
            if self.halving is not None:
                self.halving.ran.append(part if isinstance(part, list) else [part])
        for failure in self.failures[known:]:
            in_order.fail(failure["idx"])
        return list(in_order.ready())

    def parts(self, unit: Unit, halving: Halving | None) -> list[tuple[Unit, Any]]:
        """``[(unit, result)]``, or the one-item batches that succeeded when a batch was retried item by
        item, or the halves of a batch that ran out of memory (``halving``; a single item that does not
        fit fails as any item does)."""
        try:
            return [(unit, call_with_env(self.forward, unit, env=self.env))]
        except (ConfigError, DiskFullError):
            raise
        except Exception as exc:
            if no_space(exc) is not None:  # not the item's fault: every item would fail ("skip" too)
                raise
            if halving is not None and isinstance(unit, list) and len(unit) > 1 and is_out_of_memory(exc):
                halving.split(unit_label(unit, self.label_env, self.idx_key), len(unit), exc)
            else:
                return self.failed(unit, exc)
        # out of the except block: the failed batch's traceback (and the tensors it holds) is gone
        return [part for half in halves(unit) for part in self.parts(half, halving)]

    def failed(self, unit: Unit, exc: Exception) -> list[tuple[Unit, Any]]:
        """A unit whose ``forward`` raised ``exc``: raised again naming its items, or under ``on_error:
        skip`` retried item by item, the failing items recorded in ``failures``."""
        if self.on_error != "skip":
            raise ItemError(
                f"{unit_label(unit, self.label_env, self.idx_key)}: {describe(exc)}", retryable=is_retryable(exc)
            ) from exc
        if isinstance(unit, list) and len(unit) > 1:
            return [p for i in unit for p in self.parts([i], halving=None)]
        index = unit[0] if isinstance(unit, list) else unit
        label = unit_label(unit, self.label_env, self.idx_key)
        self.failures.append({"idx": index, "item": label, "error": describe(exc)})
        return []


def unit_label(unit: Unit, env: dict, idx_key: str = "utt_id") -> str:
    """``item 7 (utt_id='u7')``, ``items 8..11 (utt_id 'u8'..'u11')``, or without ids when the
    dataset cannot tell them."""
    indices = unit if isinstance(unit, list) else [unit]
    ids = [_utt_id(env, i, idx_key) for i in (indices[0], indices[-1])]
    if len(indices) == 1:
        return f"item {indices[0]}" + (f" ({idx_key}={ids[0]!r})" if ids[0] is not None else "")
    span = f"items {indices[0]}..{indices[-1]}"
    return span + (f" ({idx_key} {ids[0]!r}..{ids[1]!r})" if None not in ids else "")


def _utt_id(env: dict, index: int, idx_key: str) -> Any:
    try:
        item = env["dataset"][index]
        return item.get(idx_key) if isinstance(item, dict) else None
    except Exception:  # noqa: BLE001 - a label is best effort; the item itself may be what fails
        return None
