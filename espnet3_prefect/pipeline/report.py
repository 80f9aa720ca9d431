"""Report: progress (terminal bar + Prefect progress artifact) and the closing summary table."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, TextIO

from espnet3_prefect.pipeline.throughput import ShardStats, add_worker, of_summary, throughput_line

log = logging.getLogger("espnet3_prefect")

#: the least time between two updates of the progress artifact (the UI's progress bar) before the end
ARTIFACT_EVERY_S = 5.0


class Progress:
    """Counts finished shards; draws a bar on a terminal and updates a Prefect progress artifact."""

    def __init__(
        self,
        label: str,
        total_shards: int,
        total_items: int,
        *,
        stream: TextIO | None = None,
        artifact: bool = True,
        kind: str = "infer",
    ):
        self.label, self.total_shards, self.total_items = label, total_shards, total_items
        self.shards = self.items = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self._artifact_id = None
        self._last_pct = -1
        self._artifact_pct, self._artifact_time = 0.0, time.perf_counter()
        self._artifact = artifact
        self._description = f"{kind} {label}: shards done of {total_shards}"
        self._catching_up = None  # the thread that sends the artifact once an unreachable server is back
        if artifact:
            self._send(0.0)
        self._draw()

    def advance(self, items: int) -> None:
        """One more shard done, covering ``items`` items."""
        self.shards += 1
        self.items += items
        self._update_artifact()
        self._draw()

    def _update_artifact(self) -> None:
        """At most every :data:`ARTIFACT_EVERY_S` seconds, and at the end: each update is an API round
        trip and server work (the artifact row, its event), whatever the number of shards."""
        pct = 100.0 * self.shards / self.total_shards
        now = time.perf_counter()
        due = now - self._artifact_time >= ARTIFACT_EVERY_S or self.shards == self.total_shards
        if self._artifact and due:
            self._send(pct)
            self._artifact_pct, self._artifact_time = pct, now

    def _send(self, pct: float) -> None:
        """Create or update the artifact, unless the run's server is unreachable just now: then one
        daemon thread sends the latest progress once it answers, and the booking of shards never waits
        for the server (an update blocked in the client's retries stalled the bar for the outage)."""
        from espnet3_prefect.execution.api_reach import server_out

        if self._catching_up is None and not server_out():
            try:
                self._write(pct)
                return
            except Exception as exc:  # noqa: BLE001 - the server went away meanwhile: said by its watch
                log.debug("progress artifact not sent: %s", exc)
        if self._catching_up is None:
            import contextvars
            import threading

            context = contextvars.copy_context()  # the flow run's API settings go with it
            self._catching_up = threading.Thread(
                target=context.run, args=(self._send_when_back,), name="e3p-progress-catch-up", daemon=True
            )
            self._catching_up.start()

    def _send_when_back(self) -> None:
        from espnet3_prefect.execution.api_reach import wait_until_up

        try:
            sent = -1
            while wait_until_up() and sent != self.shards:  # shards booked while it sent: once more
                sent = self.shards
                self._write(100.0 * sent / max(1, self.total_shards))
        except Exception as exc:  # noqa: BLE001 - a report only
            log.debug("progress artifact not sent: %s", exc)
        finally:
            self._catching_up = None

    def _write(self, pct: float) -> None:
        if self._artifact_id is None:
            from prefect.artifacts import create_progress_artifact

            self._artifact_id = create_progress_artifact(progress=pct, description=self._description)
        else:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self._artifact_id, progress=pct)

    def _draw(self) -> None:
        pct = int(100 * self.shards / max(1, self.total_shards))
        elapsed = time.perf_counter() - self.started
        rate = self.items / elapsed if elapsed > 0 else 0.0
        text = (
            f"{self.label}: {self.shards}/{self.total_shards} shards, {self.items}/{self.total_items} items, "
            f"{rate:.0f} items/s"
        )
        if self.tty:
            filled = pct * 30 // 100
            self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {pct:3d}% {text}")
            if self.shards == self.total_shards:
                self.stream.write("\n")
            self.stream.flush()
        elif pct // 25 != self._last_pct // 25 or self.shards == self.total_shards:
            self.stream.write(f"{pct:3d}% {text}\n")
            self.stream.flush()
        self._last_pct = pct


# ``extra=`` for a flow's log line that the CLI prints on stdout itself (the closing summary): the flow-run
# log (the UI) keeps it, the CLI's terminal shows it once.
CONSOLE_OFF = {"e3p_console": False}


def drop_from_console(record) -> bool:
    """A logging filter for console handlers: drops records logged with ``extra=CONSOLE_OFF``.

    >>> import logging
    >>> record = logging.LogRecord("x", logging.INFO, __file__, 1, "summary", None, None)
    >>> drop_from_console(record), record.__dict__.update(CONSOLE_OFF), drop_from_console(record)
    (True, None, False)
    """
    return getattr(record, "e3p_console", True)


# Set (any non-empty value) to keep every Prefect line on the terminal; the CLI's --verbose sets it.
VERBOSE_ENV = "ESPNET3_PREFECT_VERBOSE"


def drop_task_completions(record) -> bool:
    """A logging filter for console handlers: drops a task run's INFO "Finished in state Completed()"
    (or Cached) line, so a shard shows one line (its own ``split.N: ...``); failures stay. Kept with
    ``$ESPNET3_PREFECT_VERBOSE``.

    >>> import logging
    >>> line = lambda name, level, msg: logging.LogRecord(name, level, "f", 1, msg, None, None)
    >>> drop_task_completions(line("prefect.task_runs", logging.INFO, "Finished in state Completed()"))
    False
    >>> drop_task_completions(line("prefect.task_runs", logging.ERROR, "Finished in state Failed('x')"))
    True
    """
    if os.environ.get(VERBOSE_ENV):
        return True
    return not (
        record.name.startswith("prefect.task_runs")
        and record.levelno == logging.INFO
        and str(record.msg).startswith("Finished in state ")
    )


def quiet_console() -> None:
    """Add :func:`drop_task_completions` to this process's Prefect console handlers (once); called
    where task runs log: the driver and each worker (when it imports our tasks)."""
    for handler in logging.getLogger().handlers + logging.getLogger("prefect").handlers:
        if type(handler).__name__ == "PrefectConsoleHandler" and drop_task_completions not in handler.filters:
            handler.addFilter(drop_task_completions)


TIMING_KEYS = ("load_s", "wait_s", "forward_s", "write_s")


def empty_timing() -> dict[str, Any]:
    """Where a test set's shard time went, summed over the shards run (none yet)."""
    return {"load_s": None, "wait_s": 0.0, "forward_s": 0.0, "write_s": 0.0, "busy_s": 0.0, "wall_s": 0.0, "shards": 0}


def add_timing(total: dict[str, Any], shard_summary: dict[str, Any]) -> dict[str, Any]:
    """Add one shard's ``timing`` (see :class:`espnet3_prefect.pipeline.prefetch.Timing`) and its seconds to ``total``.

    >>> t = add_timing(empty_timing(), {"seconds": 2.0, "timing": {"load_s": 1.0, "wait_s": 0.1,
    ...                                  "forward_s": 1.5, "write_s": 0.2}})
    >>> t["load_s"], t["forward_s"], t["busy_s"], t["shards"]
    (1.0, 1.5, 2.0, 1)
    """
    timing = shard_summary.get("timing") or {}
    for key in TIMING_KEYS:
        value = timing.get(key)
        if value is not None:
            total[key] = round((total.get(key) or 0.0) + float(value), 4)
    total["busy_s"] = round(total.get("busy_s", 0.0) + ShardStats.from_dict(shard_summary).seconds, 4)
    total["shards"] = total.get("shards", 0) + 1
    add_padding(total, shard_summary.get("padding"))
    add_worker(total, shard_summary)
    if shard_summary.get("lengths_unit"):  # lengths the shard read itself (audio headers)
        total["lengths_unit"] = shard_summary["lengths_unit"]
    return total


def add_padding(total: dict[str, Any], padding: dict[str, Any] | None) -> None:
    """Sum a shard's ``padding`` (``{"batches", "real", "padded"}``, present when its items' lengths
    are known) into ``total["padding"]``; ``real / padded`` is the padding efficiency.

    >>> t = {}
    >>> add_padding(t, {"batches": 2, "real": 6.0, "padded": 8.0}); add_padding(t, None); t["padding"]
    {'batches': 2, 'real': 6.0, 'padded': 8.0}
    """
    if not padding:
        return
    summed = total.setdefault("padding", {"batches": 0, "real": 0.0, "padded": 0.0})
    summed["batches"] += int(padding.get("batches") or 0)
    for key in ("real", "padded"):
        summed[key] = round(summed[key] + float(padding.get(key) or 0.0), 6)


def utilisation(timing: dict[str, Any] | None, workers: int) -> float | None:
    """Share of the workers' time spent in shards while the test set's shards ran (None: none ran).

    >>> utilisation({"busy_s": 9.0, "wall_s": 5.0}, 2)
    0.9
    """
    if not timing or not timing.get("busy_s") or not timing.get("wall_s") or not workers:
        return None
    return round(min(1.0, timing["busy_s"] / (workers * timing["wall_s"])), 3)


def bound_by(timing: dict[str, Any] | None) -> str:
    """What limits the shards: ``data loading`` when reading items takes longer than the shard loop's
    own work (forward + writing, which prefetch overlaps it with), else the larger of ``model`` and
    ``writing``; empty when no shard ran.

    >>> bound_by({"busy_s": 1, "load_s": 5.0, "forward_s": 3.0, "write_s": 1.0}), bound_by({"busy_s": 1,
    ...     "load_s": None, "forward_s": 3.0, "write_s": 1.0})
    ('data loading', 'model')
    """
    if not timing or not timing.get("busy_s"):
        return ""
    forward, write = timing.get("forward_s") or 0.0, timing.get("write_s") or 0.0
    load = timing.get("load_s")
    if load is not None and load > forward + write:
        return "data loading"
    return "writing" if write > forward else "model"


def summary_rows(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per test set: shards run / cached, items, seconds, items/s, and where the shards'
    time went (loading, waiting for data, forward, writing; worker utilisation; what bounds it)."""
    rows = []
    for s in summaries:
        seconds = s["seconds"]
        timing = s.get("timing") or {}
        load = timing.get("load_s")
        rows.append(
            {
                "test_set": s["test_set"],
                "shards": s["shards"],
                "shards_run": s["shards_run"],
                "shards_cached": s["shards_cached"],
                "items": s["items"],
                "failed": s.get("failed", 0),
                "seconds": round(seconds, 2),
                # the rate of the work done: items of the shards that ran (cached shards cost nothing)
                "items_per_s": _rate(s.get("items_run", s["items"] if s["shards_run"] else 0), seconds),
                "load_s": None if load is None else round(load, 2),
                "wait_s": round(timing.get("wait_s") or 0.0, 2),
                "forward_s": round(timing.get("forward_s") or 0.0, 2),
                "write_s": round(timing.get("write_s") or 0.0, 2),
                "utilisation": utilisation(timing, s.get("workers") or 0),
                "bound": bound_by(timing),
                **_throughput_columns(of_summary(s)),
                **audio_costs(s),
            }
        )
    return rows


def _throughput_columns(data: dict[str, Any] | None) -> dict[str, Any]:
    """RTFx, audio seconds, padding efficiency and GPU busy share of a test set (None where unknown)."""
    data = data or {}
    return {key: data.get(key) for key in ("rtfx", "rtfx_per_worker_s", "audio_s", "padding_efficiency", "gpu_busy")}


def audio_costs(s: dict[str, Any]) -> dict[str, Any]:
    """A stage whose outputs are waveforms (TTS: ``generated_s``, seconds generated): its unit is the audio
    second, and the wall time is also given per item and per second of output (of the shards that ran;
    a cached test set costs nothing). ``{}`` for any other stage.

    >>> audio_costs({"generated_s": 4.0, "seconds": 10.0, "items": 4, "items_run": 4, "shards_run": 2})
    {'generated_s': 4.0, 's_per_item': 2.5, 's_per_generated_s': 2.5}
    >>> audio_costs({"seconds": 1.0, "items": 4, "shards_run": 1})
    {}
    """
    audio = s.get("generated_s")
    if audio is None:
        return {}
    items = s.get("items_run", s["items"] if s["shards_run"] else 0)
    seconds = s["seconds"]
    ran = items and seconds > 0 and items == s["items"]  # per second of output: only when every item ran
    return {
        "generated_s": round(audio, 2),
        "s_per_item": round(seconds / items, 2) if items and seconds > 0 else None,
        "s_per_generated_s": round(seconds / audio, 2) if ran and audio > 0 else None,
    }


def audio_line(row: dict[str, Any]) -> str:
    """``audio: 3.8 s generated; 2.1 s per item, 2.2 s per second of output`` (``""`` for non-audio rows).

    >>> audio_line({"generated_s": 3.8, "s_per_item": 2.1, "s_per_generated_s": 2.2})
    'audio: 3.8 s generated; 2.1 s per item, 2.2 s per second of output'
    >>> audio_line({"generated_s": 3.8, "s_per_item": None, "s_per_generated_s": None}), audio_line({})
    ('audio: 3.8 s generated', '')
    """
    if "generated_s" not in row:
        return ""
    costs = [
        f"{row[key]} s per {unit}"
        for key, unit in (("s_per_item", "item"), ("s_per_generated_s", "second of output"))
        if row.get(key) is not None
    ]
    return f"audio: {row['generated_s']} s generated" + (f"; {', '.join(costs)}" if costs else "")


def _rate(items: int, seconds: float) -> float | None:
    """Items per second, or None when nothing ran (a cached test set has no rate).

    >>> _rate(10, 4.0), _rate(0, 0.8)
    (2.5, None)
    """
    return round(items / seconds, 1) if items and seconds > 0 else None


def publish_summary(summaries: list[dict[str, Any]]) -> None:
    """The summary as a Prefect table artifact on the current flow run, and per test set whose shards
    ran its throughput per worker (:func:`espnet3_prefect.pipeline.throughput.publish`)."""
    from prefect.artifacts import create_table_artifact

    from espnet3_prefect.pipeline.throughput import publish

    for summary in summaries:
        data = of_summary(summary)
        if data:
            publish(summary["test_set"], data)
    create_table_artifact(
        table=summary_rows(summaries),
        key="infer-summary",
        description="infer: per test set shards, items, seconds, items/s; time in shards "
        "(s, summed over workers): loading items, waiting for them, forward, "
        "writing; worker utilisation; what bounds the run; RTFx (audio seconds per wall second, and "
        "per worker-second), audio seconds, padding efficiency, GPU busy share; for waveform outputs "
        "(TTS) the audio seconds generated and the wall seconds per item and per second of output",
    )


def timing_line(row: dict[str, Any]) -> str:
    """``time in shards: load 8.1 s (waited 0.3 s), forward 14.2 s, write 0.6 s; workers 91% busy; bound by model``.

    >>> timing_line({"shards_run": 1, "load_s": None, "wait_s": 0.0, "forward_s": 2.0, "write_s": 0.5,
    ...              "utilisation": 0.5, "bound": "model"})
    'time in shards: forward 2.0 s (item reads included), write 0.5 s; workers 50% busy; bound by model'
    """
    if not row["shards_run"]:
        return ""
    if row["load_s"] is None:
        parts = [f"forward {row['forward_s']} s (item reads included)"]
    else:
        parts = [f"load {row['load_s']} s (waited {row['wait_s']} s)", f"forward {row['forward_s']} s"]
    parts.append(f"write {row['write_s']} s")
    busy = f"; workers {round(100 * row['utilisation'])}% busy" if row["utilisation"] is not None else ""
    return f"time in shards: {', '.join(parts)}{busy}; bound by {row['bound']}"


def format_summary(summaries: list[dict[str, Any]]) -> str:
    """The closing summary for the terminal: one line per test set, where its time went, its output files."""
    lines = []
    for row, s in zip(summary_rows(summaries), summaries):
        failed = f", {row['failed']} failed (skipped)" if row["failed"] else ""
        lines.append(
            f"{row['test_set']}: {row['items']} items, {row['shards_run']} shards run, "
            f"{row['shards_cached']} cached{failed}, {row['seconds']} s"
            + (f" ({row['items_per_s']} items/s)" if row["items_per_s"] is not None else "")
        )
        timing = timing_line(row)
        if timing:
            lines.append(f"    {timing}")
        throughput = throughput_line(of_summary(s))
        if throughput:
            lines.append(f"    {throughput}")
        audio = audio_line(row)
        if audio:
            lines.append(f"    {audio}")
        for name, path in sorted((s.get("outputs") or {}).items()):
            lines.append(f"    {name}: {path}")
    return "\n".join(lines)
