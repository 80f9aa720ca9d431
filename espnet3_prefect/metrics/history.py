"""Evaluation history: model identity, ``evaluate_history.jsonl``, the trend table and plot.

One JSON line per ``evaluate`` run, appended next to the outputs
(``<inference_dir>/evaluate_history.jsonl``): run time, config fingerprint, model identity and
the scores. The trend (markdown table + ``evaluate_history.png``) is rebuilt from it each run.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from espnet3_prefect._internal.atomic import atomic_open, file_digest, fsync_dir
from espnet3_prefect._internal.png import COLOR_NAMES, line_chart
from espnet3_prefect.config.load import fingerprint

HISTORY_FILE = "evaluate_history.jsonl"
PLOT_FILE = "evaluate_history.png"
TREND_RUNS = 20


def _string_leaves(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, (DictConfig, dict)):
        for key, value in node.items():
            if key != "_target_":
                yield from _string_leaves(value, f"{prefix}.{key}")
    elif isinstance(node, (ListConfig, list)):
        for i, value in enumerate(node):
            yield from _string_leaves(value, f"{prefix}[{i}]")
    elif isinstance(node, str):
        yield prefix, node


def model_identity(cfg: DictConfig) -> dict:
    """What model an inference config evaluates.

    Every string under ``model`` (and ``provider.params``) that names an existing file (a
    checkpoint, a train config) is identified by path, size, mtime and sha256; the identity id
    is the hash of the paths and contents, so a touched but unchanged file is the same model.
    Without such files the model is its config (``model`` block fingerprint).
    """
    files = []
    for section in ("model", "provider.params"):
        node = OmegaConf.select(cfg, section)
        for key, value in _string_leaves(node, section) if node is not None else ():
            path = Path(value).expanduser()
            if len(value) < 4096 and path.is_file():
                stat = path.stat()
                files.append(
                    {
                        "key": key,
                        "path": str(path.resolve()),
                        "bytes": stat.st_size,
                        "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(timespec="seconds"),
                        "sha256": file_digest(path)["sha256"],
                    }
                )
    if files:
        ident = fingerprint({"files": [[f["path"], f["sha256"]] for f in files]})[:16]
        return {"kind": "files", "id": ident, "files": files}
    model = OmegaConf.select(cfg, "model")
    block = OmegaConf.to_container(model, resolve=True) if isinstance(model, (DictConfig, ListConfig)) else model
    return {"kind": "config", "id": fingerprint({"model": block})[:16]}


def describe_model(identity: dict) -> str:
    if identity["kind"] == "files":
        parts = [
            f"{Path(f['path']).name} ({f['bytes']} B, mtime {f['mtime']}, sha256 {f['sha256'][:12]})"
            for f in identity["files"]
        ]
        return f"files {', '.join(parts)} -> id {identity['id']}"
    return f"model config fingerprint {identity['id']} (no model file named in the config)"


def read_history(path: Path) -> list[dict]:
    """Records in run order; a torn last line (crash mid-append) is skipped."""
    if not path.is_file():
        return []
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def append_history(path: Path, record: dict) -> None:
    """Append one record as one line, in a single write, then fsync."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def series_keys(records: list[dict]) -> list[tuple[str, str]]:
    """(metric label, test set) pairs in first-seen order over the history."""
    keys: list[tuple[str, str]] = []
    for record in records:
        for label, per_test in record.get("headline", {}).items():
            for test_set in per_test:
                if (label, test_set) not in keys:
                    keys.append((label, test_set))
    return keys


def write_plot(records: list[dict], path: Path) -> list[tuple[str, str]]:
    """Write the trend PNG (last :data:`TREND_RUNS` runs) atomically; returns the plotted series."""
    recent = records[-TREND_RUNS:]
    keys = series_keys(recent)
    series = [[r.get("headline", {}).get(label, {}).get(test_set) for r in recent] for label, test_set in keys]
    with atomic_open(path, "wb") as handle:
        handle.write(line_chart(series))
    return keys


def _fmt(value: Any) -> str:
    return "-" if value is None else (f"{value:.2f}" if isinstance(value, (int, float)) else str(value))


def trend_markdown(records: list[dict], plot: Path | None, status: str, limit: int = TREND_RUNS) -> str:
    """The artifact: this run's status, then one row per past run (newest last) with deltas."""
    recent = records[-limit:]
    keys = series_keys(recent)
    current = records[-1]
    lines = [
        f"# evaluate: {current['inference_dir']}",
        "",
        f"**This run:** {status}",
        "",
        f"- model: {describe_model(current['model'])}",
        f"- config fingerprint: `{current['config_fingerprint'][:16]}`",
        f"- infer: {current['shards_run']} shard(s) run, {current['shards_cached']} from cache",
        "",
        f"## Trend (last {len(recent)} of {len(records)} runs, newest last)",
        "",
    ]
    head = ["run (UTC)", "model", "config", "from cache"] + [f"{label} {test}" for label, test in keys]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    previous: dict = {}
    for record in recent:
        cells = [
            record["run_time"],
            f"`{record['model']['id'][:8]}`",
            f"`{record['config_fingerprint'][:8]}`",
            "yes" if record.get("answered_from_cache") else "no",
        ]
        for label, test in keys:
            value = record.get("headline", {}).get(label, {}).get(test)
            before = previous.get((label, test))
            delta = ""
            if isinstance(value, (int, float)) and isinstance(before, (int, float)):
                diff = value - before
                delta = " (=)" if abs(diff) < 0.005 else f" ({diff:+.2f})"
            cells.append(_fmt(value) + delta)
            if value is not None:
                previous[(label, test)] = value
        lines.append("| " + " | ".join(cells) + " |")
    if plot is not None and plot.is_file():
        legend = ", ".join(
            f"{COLOR_NAMES[i % len(COLOR_NAMES)]}: {label} {test}" for i, (label, test) in enumerate(keys)
        )
        encoded = base64.b64encode(plot.read_bytes()).decode()
        lines += ["", f"Plot `{plot}` ({legend}):", "", f"![score trend](data:image/png;base64,{encoded})"]
    return "\n".join(lines) + "\n"
