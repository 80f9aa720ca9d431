"""Report: progress (terminal bar + Prefect progress artifact) and the closing summary table."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """Counts finished shards; draws a bar on a terminal and updates a Prefect progress artifact."""

    def __init__(self, label: str, total_shards: int, total_items: int, *, stream: TextIO | None = None,
                 artifact: bool = True, kind: str = "infer"):
        self.label, self.total_shards, self.total_items = label, total_shards, total_items
        self.shards = self.items = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.perf_counter()
        self._artifact_id = None
        self._last_pct = -1
        self._artifact_pct, self._artifact_time = 0.0, time.perf_counter()
        if artifact:
            from prefect.artifacts import create_progress_artifact

            self._artifact_id = create_progress_artifact(
                progress=0.0, description=f"{kind} {label}: shards done of {total_shards}")
        self._draw()

    def advance(self, items: int) -> None:
        """One more shard done, covering ``items`` items."""
        self.shards += 1
        self.items += items
        self._update_artifact()
        self._draw()

    def _update_artifact(self) -> None:
        """At most every 5% or 2 s, and at the end: each update is an API round trip (~40 ms)."""
        pct = 100.0 * self.shards / self.total_shards
        now = time.perf_counter()
        due = pct - self._artifact_pct >= 5 or now - self._artifact_time >= 2 or self.shards == self.total_shards
        if self._artifact_id is not None and due:
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self._artifact_id, progress=pct)
            self._artifact_pct, self._artifact_time = pct, now

    def _draw(self) -> None:
        pct = int(100 * self.shards / max(1, self.total_shards))
        elapsed = time.perf_counter() - self.started
        rate = self.items / elapsed if elapsed > 0 else 0.0
        text = (f"{self.label}: {self.shards}/{self.total_shards} shards, {self.items}/{self.total_items} items, "
                f"{rate:.0f} items/s")
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


def summary_rows(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per test set: shards run / cached, items, seconds, items/s."""
    rows = []
    for s in summaries:
        seconds = s["seconds"]
        rows.append({
            "test_set": s["test_set"], "shards": s["shards"], "shards_run": s["shards_run"],
            "shards_cached": s["shards_cached"], "items": s["items"], "failed": s.get("failed", 0),
            "seconds": round(seconds, 2),
            "items_per_s": round(s["items"] / seconds, 1) if seconds > 0 else 0.0,
        })
    return rows


def publish_summary(summaries: list[dict[str, Any]]) -> None:
    """The summary as a Prefect table artifact on the current flow run."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(table=summary_rows(summaries), key="infer-summary",
                          description="infer: per test set shards, items, seconds, items/s")


def format_summary(summaries: list[dict[str, Any]]) -> str:
    """The closing summary for the terminal: one line per test set plus its output files."""
    lines = []
    for row, s in zip(summary_rows(summaries), summaries):
        failed = f", {row['failed']} failed (skipped)" if row["failed"] else ""
        lines.append(f"{row['test_set']}: {row['items']} items, {row['shards_run']} shards run, "
                     f"{row['shards_cached']} cached{failed}, {row['seconds']} s ({row['items_per_s']} items/s)")
        for name, path in sorted((s.get("outputs") or {}).items()):
            lines.append(f"    {name}: {path}")
    return "\n".join(lines)
