"""The trend across checkpoints: one point per checkpoint content scored with this config, in checkpoint
order (step, else epoch, else the order they were scored), the best marked; a markdown table for the
``evaluate-checkpoints`` artifact and ``evaluate_checkpoints.png`` beside the history: one panel per
metric over the training step (the checkpoint index, said so on the axis, where steps are unknown).

Best is the lowest value for error rates (a headline label ending in ``ER``: WER, CER, TER, ...),
the highest for any other score.

>>> lower_is_better("WER"), lower_is_better("BLEU")
(True, False)
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from espnet3_prefect.checkpoints.checkpoint import order_field
from espnet3_prefect.disk.layout import CHECKPOINT_PLOT_NAME
from espnet3_prefect.metrics.history import lower_is_better, series_keys, trend_figure, write_chart

CHECKPOINT_PLOT_FILE = CHECKPOINT_PLOT_NAME


def checkpoint_points(records: list[dict], config_fingerprint: str) -> list[dict]:
    """The latest record of each checkpoint content scored with ``config_fingerprint``, in checkpoint order."""
    latest: dict[str, dict] = {}
    for record in records:
        ckpt = record.get("checkpoint")
        if ckpt and record.get("config_fingerprint") == config_fingerprint:
            latest.pop(ckpt["sha256"], None)  # keep first-scored order, latest scores
            latest[ckpt["sha256"]] = record
    points = list(latest.values())
    field = order_field([p["checkpoint"] for p in points])
    if field:
        points.sort(key=lambda p: p["checkpoint"][field])
    return points


def best_points(points: list[dict]) -> dict[tuple[str, str], int]:
    """``(label, test set) -> index`` of the best point of each series."""
    best: dict[tuple[str, str], int] = {}
    for label, test in series_keys(points):
        values = [(p.get("headline", {}).get(label, {}).get(test), i) for i, p in enumerate(points)]
        values = [(v, i) for v, i in values if isinstance(v, (int, float))]
        if values:
            sign = 1 if lower_is_better(label) else -1
            best[(label, test)] = min(values, key=lambda vi: (sign * vi[0], vi[1]))[1]
    return best


def plot_axis(points: list[dict]) -> tuple[list[float], str]:
    """The x of each point and the axis title: the training step where every checkpoint has one, else
    the epoch, else the checkpoint's number in the order scored (the title says what is unknown).

    >>> plot_axis([{"checkpoint": {"step": 500, "epoch": 1}}, {"checkpoint": {"step": 900, "epoch": 2}}])
    ([500, 900], 'training step')
    >>> plot_axis([{"checkpoint": {"step": None, "epoch": None}}])
    ([1], 'checkpoint # in the order scored (training steps unknown)')
    """
    field = order_field([p["checkpoint"] for p in points])
    if field == "step":
        return [p["checkpoint"]["step"] for p in points], "training step"
    if field == "epoch":
        return [p["checkpoint"]["epoch"] for p in points], "epoch (training steps unknown)"
    return list(range(1, len(points) + 1)), "checkpoint # in the order scored (training steps unknown)"


def checkpoint_figure(points: list[dict]):
    """The Figure of :func:`write_checkpoint_plot`: one panel per metric, its test sets as lines over
    :func:`plot_axis`, the best point of each ringed."""
    keys = series_keys(points)
    series = [[p.get("headline", {}).get(label, {}).get(test) for p in points] for label, test in keys]
    x, xlabel = plot_axis(points)
    title = f"evaluate: scores per checkpoint ({len(points)} checkpoint{'s' if len(points) != 1 else ''})"
    return trend_figure(title, x, xlabel, keys, series, best=best_points(points))


def write_checkpoint_plot(points: list[dict], path: Path) -> list[tuple[str, str]]:
    """The PNG (:func:`checkpoint_figure`); no file (and a log line) where it cannot be drawn."""
    write_chart(path, "checkpoint trend", lambda: checkpoint_figure(points))
    return series_keys(points)


def _label(ckpt: dict) -> str:
    parts = [f"{k} {ckpt[k]}" for k in ("epoch", "step") if ckpt.get(k) is not None]
    return f"`{ckpt['name']}`" + (f" ({', '.join(parts)})" if parts else "")


def checkpoint_markdown(points: list[dict], current: dict, plot: Path | None) -> str:
    """The artifact: this run's checkpoint and status, then one row per checkpoint (in order), best in bold."""
    keys = series_keys(points)
    best = best_points(points)
    ckpt = current["checkpoint"]
    lines = [
        f"# evaluate per checkpoint: {current['inference_dir']}",
        "",
        f"**This run:** {_label(ckpt)}, sha256 `{ckpt['sha256'][:12]}`: {current['status']}",
        "",
        f"- path: `{ckpt['path']}`",
        f"- config fingerprint: `{current['config_fingerprint'][:16]}`",
        f"- order: by {order_field([p['checkpoint'] for p in points]) or 'the order they were scored'}; "
        f"best in bold (lowest error rate, highest other score)",
        "",
        f"## Trend over {len(points)} checkpoint(s)",
        "",
    ]
    head = ["#", "checkpoint", "sha256", "scored (UTC)"] + [f"{label} {test}" for label, test in keys]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, point in enumerate(points):
        cells = [str(i + 1), _label(point["checkpoint"]), f"`{point['checkpoint']['sha256'][:8]}`", point["run_time"]]
        for key in keys:
            value = point.get("headline", {}).get(key[0], {}).get(key[1])
            text = "-" if value is None else (f"{value:.2f}" if isinstance(value, (int, float)) else str(value))
            cells.append(f"**{text}** (best)" if best.get(key) == i else text)
        lines.append("| " + " | ".join(cells) + " |")
    if plot is not None and plot.is_file():
        encoded = base64.b64encode(plot.read_bytes()).decode()
        lines += [
            "",
            f"Plot `{plot}` (one panel per metric; the best point ringed in black):",
            "",
            f"![checkpoint trend](data:image/png;base64,{encoded})",
        ]
    return "\n".join(lines) + "\n"


def already_scored(records: list[dict], sha256: str, config_fingerprint: str) -> dict[str, Any] | None:
    """The record that scored this checkpoint content with this config, if any (latest)."""
    for record in reversed(records):
        if (record.get("checkpoint") or {}).get("sha256") == sha256 and record.get(
            "config_fingerprint"
        ) == config_fingerprint:
            return record
    return None
