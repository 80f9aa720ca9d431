"""Evaluation history: model identity, ``evaluate_history.jsonl``, the trend table and plot.

One JSON line per ``evaluate`` run, appended next to the outputs
(``<inference_dir>/evaluate_history.jsonl``): run time, config fingerprint, model identity and
the scores. The trend (markdown table + ``evaluate_history.png``) is rebuilt from it each run.
The plot (:func:`trend_figure`, matplotlib) has one panel per metric, each with its own y axis; where
it cannot be drawn the artifact is the table alone.
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from espnet3_prefect._internal.atomic import atomic_open, file_digest, fsync_dir
from espnet3_prefect.config.load import fingerprint
from espnet3_prefect.pipeline.throughput import chart_png

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


def lower_is_better(label: str) -> bool:
    """An error rate (a label ending in ``ER``: WER, CER, TER, ...): lower is better."""
    return label.upper().endswith("ER")


def _number(value: Any) -> float:
    """A score as a float; NaN where it is missing or not a number (a gap in its line)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else math.nan


def trend_figure(
    title: str,
    x: list[float],
    xlabel: str,
    keys: list[tuple[str, str]],
    series: list[list[Any]],
    best: dict[tuple[str, str], int] | None = None,
):
    """Scores over ``x`` as a matplotlib ``Figure``, 800 px wide: one panel per metric label, stacked,
    each with its own y axis (an error rate in %, lower is better); one line per test set, the same
    colour in every panel, a point per run and no line across a missing value; ``best`` (key -> index)
    ringed in black. ``series[k]`` holds the values of ``keys[k]`` at each ``x``."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    labels = list(dict.fromkeys(label for label, _ in keys)) or ["(no scores)"]
    tests = list(dict.fromkeys(test for _, test in keys))
    fig = Figure(figsize=(8.0, 1.5 + 2.5 * len(labels)), dpi=100, layout="constrained")
    axes = fig.subplots(len(labels), 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(title)
    for ax, label in zip(axes, labels):
        mine = [(k, test) for k, (lab, test) in enumerate(keys) if lab == label]
        ringed = False
        for k, test in mine:
            color = f"C{tests.index(test) % 10}"
            ax.plot(
                x, [_number(v) for v in series[k]], marker="o", markersize=4, linewidth=1.5, color=color, label=test
            )
        for k, test in mine:  # after the lines: "best" last in the legend
            ys = [_number(v) for v in series[k]]
            point = (best or {}).get((label, test))
            if point is not None and not math.isnan(ys[point]):
                ax.plot(
                    [x[point]], [ys[point]], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                    markeredgecolor="black", markeredgewidth=1.5, label=None if ringed else "best",
                )  # fmt: skip
                ringed = True
        if not mine:
            ax.text(0.5, 0.5, "no scores yet", ha="center", va="center", transform=ax.transAxes)
        else:  # a legend also for one test set: the line's name is in the image
            ax.set_title(f"{label} on {mine[0][1]}" if len(mine) == 1 else label, fontsize=10)
            ax.legend(fontsize=8, loc="best")
        if mine:
            ax.set_ylabel(f"{label} (%, lower is better)" if lower_is_better(label) else f"{label} (higher is better)")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    axes[-1].set_xlabel(xlabel)
    return fig


def write_chart(path: Path, what: str, draw) -> bool:
    """Write ``draw()``'s Figure to ``path`` as PNG (atomically); without a chart (no matplotlib, a
    drawing error: one log line) remove a stale ``path`` instead, so the artifact is the table alone."""
    png = chart_png(what, draw)
    if png is None:
        path.unlink(missing_ok=True)
        return False
    with atomic_open(path, "wb") as handle:
        handle.write(png)
    return True


def write_plot(records: list[dict], path: Path) -> list[tuple[str, str]]:
    """Write the trend PNG (last :data:`TREND_RUNS` runs, numbered from the first run) atomically;
    returns the plotted series."""
    recent = records[-TREND_RUNS:]
    keys = series_keys(recent)
    series = [[r.get("headline", {}).get(label, {}).get(test_set) for r in recent] for label, test_set in keys]
    first = len(records) - len(recent) + 1
    x = list(range(first, len(records) + 1))
    where = "/".join(Path(str(records[-1].get("inference_dir", ""))).parts[-2:]) if records else ""
    title = f"evaluate {where}: scores per run (last {len(recent)} of {len(records)})"
    write_chart(path, "evaluate trend", lambda: trend_figure(title, x, "evaluate run (oldest left)", keys, series))
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
        encoded = base64.b64encode(plot.read_bytes()).decode()
        lines += ["", f"Plot `{plot}` (one panel per metric):", "", f"![score trend](data:image/png;base64,{encoded})"]
    return "\n".join(lines) + "\n"
