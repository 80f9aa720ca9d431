"""How fast a test set decoded, in the unit speech people use, on every run: RTFx (seconds of audio
decoded per wall second), the same per worker-second, items/s, padding efficiency (real over padded
length of the batches run) and, on GPU workers, the GPU's busy share; per test set and per worker.

Audio seconds are the summed lengths of the items of the shards that ran, when the lengths are in
seconds (audio headers, or a dataset whose ``lengths()`` say ``lengths_unit = "s"``; see
:mod:`espnet3_prefect.pipeline.lengths`). With lengths in other units (a shape file's samples or frames,
the dataset's own), or none, RTFx is not reported (``null``): items/s always is, padding efficiency
wherever lengths are known.
The wall time is the shards' (first shard submitted to last one finished), not the stage's set-up and
merge; a worker-second is a second one worker spent inside a shard.

Shown in the closing summary (:func:`throughput_line`), in the UI (a table artifact per test set, one
row per worker, and beside it a bar chart of the workers' rates by name with their mean as a line,
:func:`plot_markdown`: a slow worker shows at a glance) and written to ``<inference_dir>/<test>/.throughput.json``
(:attr:`~.layout.StageLayout.throughput`), which no upstream step reads or compares.

>>> t = {"wall_s": 10.0, "busy_s": 18.0, "padding": {"batches": 4, "real": 90.0, "padded": 100.0},
...      "by_worker": {"h:1": {"host": "h", "pid": 1, "shards": 2, "items": 30, "busy_s": 18.0, "audio": 90.0}}}
>>> f = figures(t, items_run=30, unit="s")
>>> f["rtfx"], f["rtfx_per_worker_s"], f["items_per_s"], f["padding_efficiency"]
(9.0, 5.0, 3.0, 0.9)
>>> figures(t, items_run=30, unit=None)["rtfx"] is None
True
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.atomic import atomic_open

THROUGHPUT_VERSION = 1
log = logging.getLogger("espnet3_prefect")


@dataclass(frozen=True)
class ShardStats:
    """What one shard run counts: its items, those that failed (skipped), its seconds, the ``host`` and
    ``pid`` of the process that ran it and the batch job it ran in (None outside one). A done marker and
    a shard's summary carry them flat, beside their other keys, as :meth:`to_dict` writes them (a marker
    has no ``pid``); :meth:`from_dict` reads either back.

    >>> stats = ShardStats(items=4, failed=0, seconds=1.5, host="n1", job_id=None)
    >>> stats.to_dict()
    {'items': 4, 'failed': 0, 'seconds': 1.5, 'host': 'n1', 'job_id': None}
    >>> ShardStats.from_dict({**stats.to_dict(), "pid": 7, "timing": {}}).worker
    'n1:7'
    """

    items: int
    failed: int
    seconds: float
    host: str | None
    job_id: str | None
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The keys and order the marker (without ``pid`` when it is None) and the summary hold them in."""
        out = {"items": self.items, "failed": self.failed, "seconds": self.seconds, "host": self.host}
        if self.pid is not None:
            out["pid"] = self.pid
        out["job_id"] = self.job_id
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardStats:
        """From a summary or a marker (other keys ignored; a count or seconds missing reads as 0)."""
        return cls(
            items=int(data.get("items") or 0),
            failed=int(data.get("failed") or 0),
            seconds=float(data.get("seconds") or 0.0),
            host=data.get("host"),
            job_id=data.get("job_id"),
            pid=data.get("pid"),
        )

    @property
    def worker(self) -> str:
        """``host:pid`` of the process that ran the shard."""
        return f"{self.host or '?'}:{self.pid or '?'}"


def gpu_mean(parts: Iterable[tuple[int, float]]) -> tuple[int, float | None]:
    """``(samples, busy share)`` of GPU samples taken in parts of ``(samples, busy share)``: the mean
    weighted by the samples, to 4 digits (None without samples).

    >>> gpu_mean([(10, 0.5), (30, 0.9)]), gpu_mean([])
    ((40, 0.8), (0, None))
    """
    samples, busy_sum = 0, 0.0
    for count, busy in parts:
        samples += count
        busy_sum += busy * count
    return samples, (round(busy_sum / samples, 4) if samples else None)


def add_worker(total: dict[str, Any], shard_summary: dict[str, Any]) -> None:
    """Book one shard run under its worker in ``total["by_worker"]``: shards, items, seconds in shards,
    the items' summed length (``audio``: real length of its batches) and the GPU samples.

    >>> t = {}
    >>> add_worker(t, {"host": "n1", "pid": 7, "items": 4, "seconds": 2.0, "padding": {"real": 6.0},
    ...                "gpu_busy": {"samples": 10, "busy": 0.5}})
    >>> t["by_worker"]["n1:7"]["audio"], t["by_worker"]["n1:7"]["gpu_busy"]
    (6.0, 0.5)
    """
    stats = ShardStats.from_dict(shard_summary)
    workers = total.setdefault("by_worker", {})
    row = workers.setdefault(
        stats.worker, {"host": stats.host, "pid": stats.pid, "shards": 0, "items": 0, "busy_s": 0.0}
    )
    row["shards"] += 1
    row["items"] += stats.items
    row["busy_s"] = round(row["busy_s"] + stats.seconds, 4)
    padding = shard_summary.get("padding")
    if padding:
        row["audio"] = round(row.get("audio", 0.0) + float(padding.get("real") or 0.0), 6)
    gpu = shard_summary.get("gpu_busy")
    if gpu and gpu.get("samples"):
        row["gpu_samples"], row["gpu_busy"] = gpu_mean(
            [(row.get("gpu_samples", 0), row.get("gpu_busy", 0.0)), (int(gpu["samples"]), float(gpu["busy"]))]
        )


def _ratio(num: float | None, den: float | None, digits: int = 3) -> float | None:
    return round(num / den, digits) if num is not None and den else None


def figures(timing: dict[str, Any] | None, *, items_run: int, unit: str | None) -> dict[str, Any]:
    """The throughput of the shards that ran: per test set and per worker (module docstring)."""
    timing = timing or {}
    wall, busy = timing.get("wall_s") or None, timing.get("busy_s") or None
    padding = timing.get("padding")
    seconds = unit == "s" and padding is not None
    audio_s = round(float(padding["real"]), 3) if seconds else None
    workers = []
    rows = sorted((timing.get("by_worker") or {}).items())
    for name, row in rows:
        w_audio = row.get("audio") if seconds else None
        workers.append(
            {
                "worker": name,
                "host": row.get("host"),
                "pid": row.get("pid"),
                "shards": row["shards"],
                "items": row["items"],
                "busy_s": row["busy_s"],
                "audio_s": None if w_audio is None else round(w_audio, 3),
                "rtfx_per_worker_s": _ratio(w_audio, row["busy_s"]),
                "items_per_worker_s": _ratio(row["items"], row["busy_s"]),
                "gpu_busy": row.get("gpu_busy"),
            }
        )
    return {
        "items_run": items_run,
        "wall_s": wall,
        "busy_s": busy,
        "audio_s": audio_s,
        "lengths_unit": unit,
        "rtfx": _ratio(audio_s, wall),
        "rtfx_per_worker_s": _ratio(audio_s, busy),
        "items_per_s": _ratio(items_run, wall),
        "padding_efficiency": _ratio(padding["real"], padding["padded"]) if padding else None,
        "gpu_busy": gpu_mean((row["gpu_samples"], row["gpu_busy"]) for _, row in rows if row.get("gpu_samples"))[1],
        "workers": workers,
    }


def of_summary(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The figures of one stage summary (its dict), or None when no shard ran."""
    if not summary.get("shards_run"):
        return None
    lengths = summary.get("lengths") or {}
    timing = summary.get("timing") or {}
    items_run = summary.get("items_run")
    if items_run is None:
        items_run = sum(w["items"] for w in (timing.get("by_worker") or {}).values())
    return figures(timing, items_run=items_run, unit=lengths.get("unit") or timing.get("lengths_unit"))


def throughput_line(data: dict[str, Any] | None) -> str:
    """``throughput: RTFx 41.2 (21.0 per worker-second; 180.3 s of audio in 4.4 s), padding efficiency
    0.93, GPU 71% busy``; with lengths not in seconds, ``RTFx n/a (...)`` (items/s: the line above).

    >>> throughput_line({"rtfx": None, "lengths_unit": "samples or frames", "padding_efficiency": 0.5})
    'throughput: padding efficiency 0.50; RTFx n/a (lengths in samples or frames, not seconds)'
    >>> throughput_line({"rtfx": 20.0, "rtfx_per_worker_s": 13.333, "audio_s": 120.0, "wall_s": 6.0,
    ...                  "padding_efficiency": 0.8, "gpu_busy": 0.8})
    'throughput: RTFx 20.0 (13.3 per worker-second; 120.0 s of audio in 6.0 s), padding efficiency 0.80, GPU 80% busy'
    """
    if not data:
        return ""
    parts = []
    if data.get("rtfx") is not None:
        per = data.get("rtfx_per_worker_s")
        parts.append(
            f"RTFx {data['rtfx']:.1f}"
            + (
                f" ({per:.1f} per worker-second; {data['audio_s']:.1f} s of audio in {data['wall_s']:.1f} s)"
                if per
                else ""
            )
        )
    if data.get("padding_efficiency") is not None:
        parts.append(f"padding efficiency {data['padding_efficiency']:.2f}")
    if data.get("gpu_busy") is not None:
        parts.append(f"GPU {round(100 * data['gpu_busy'])}% busy")
    if data.get("rtfx") is None:
        unit = data.get("lengths_unit")
        if unit is None and data.get("padding_efficiency") is None:
            why = "item lengths unknown"
        else:
            why = f"lengths in {unit or 'the dataset units'}, not seconds"
        return "throughput: " + "".join(f"{p}; " for p in parts) + f"RTFx n/a ({why})"
    return "throughput: " + ", ".join(parts)


def worker_rows(data: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One table row per worker (the UI's per-test-set artifact)."""
    return [dict(w) for w in (data or {}).get("workers", [])]


def artifact_key(test_set: str) -> str:
    """A Prefect artifact key for a test set's throughput (lowercase letters, digits, dashes).

    >>> artifact_key("Test_Clean.v2")
    'throughput-test-clean-v2'
    """
    return "throughput-" + (re.sub(r"[^a-z0-9]+", "-", test_set.lower()).strip("-") or "test-set")


#: The rate each worker's bar shows, by key of a worker row: (what it is, its unit).
RATES = {
    "rtfx_per_worker_s": ("RTFx per worker-second", "audio s / worker s"),
    "items_per_worker_s": ("items per worker-second", "items / worker s"),
}
#: A chart larger than this (PNG bytes) is left out of its artifact: artifacts live in Prefect's database.
MAX_CHART_BYTES = 120_000


def rate_key(workers: list[dict[str, Any]]) -> str:
    """``rtfx_per_worker_s`` when every worker has it (lengths in seconds), else ``items_per_worker_s``."""
    return "rtfx_per_worker_s" if all(w.get("rtfx_per_worker_s") is not None for w in workers) else "items_per_worker_s"


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def workers_figure(test_set: str, workers: list[dict[str, Any]]):
    """The workers' rates as a matplotlib ``Figure`` (800 x 400 px, wider past 32 workers): one bar per
    worker, named on the x axis, its value above it (``n/a``: no bar), and the mean over the workers as
    a dashed line, both in the legend; a slow worker is a bar well under the line."""
    from matplotlib.figure import Figure

    key = rate_key(workers)
    what, unit = RATES[key]
    names = [str(w.get("worker", "?")) for w in workers]
    values = [_finite(w.get(key)) for w in workers]
    n = len(workers)
    fig = Figure(figsize=(max(8.0, min(24.0, 0.25 * n)), 4.0), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(n))
    bars = ax.bar(xs, [v or 0.0 for v in values], color="tab:blue", width=0.6, label=f"{what} of each worker")
    if n <= 48:
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v:.3g}" for v in values], padding=2, fontsize=8)
    known = [v for v in values if v is not None]
    top = max(known, default=0.0)
    if known:
        mean = sum(known) / len(known)
        ax.axhline(mean, color="tab:red", linestyle="--", linewidth=1.5, label=f"mean of {len(known)}: {mean:.3g}")
    ax.set_ylim(0.0, 1.3 * top if top > 0 else 1.0)
    longest = max((len(name) for name in names), default=0)
    rotation = 0 if n * max(longest, 4) <= 90 else (30 if n <= 24 else 90)
    ax.set_xticks(
        xs, names, rotation=rotation, ha="right" if rotation == 30 else "center", fontsize=9 if n <= 24 else 7
    )
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_title(f"{test_set}: {what}, by worker")
    ax.set_xlabel("worker (host:pid)")
    ax.set_ylabel(f"{what}\n({unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc="upper right", ncols=2, fontsize=9)  # above the tallest bar: the y axis has room
    return fig


def figure_png(fig) -> bytes:
    """A Figure's PNG bytes, drawn by the Agg canvas (no pyplot, no display, no global state), in 64
    colours: a few tens of KB, as artifacts are stored in Prefect's database."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image  # matplotlib's own dependency

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    # 64 colours (octree: each within a few levels of the original) are plenty for flat bars, lines and
    # antialiased text, at a third of the bytes of RGBA
    image = image.convert("RGB").quantize(colors=64, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def chart_png(what: str, draw) -> bytes | None:
    """``figure_png(draw())``, or None, with one log line, when matplotlib is missing, the drawing fails
    or the PNG is over :data:`MAX_CHART_BYTES`: a chart never fails a run (the table stays)."""
    try:
        png = figure_png(draw())
    except ImportError as err:
        log.warning("%s: no chart (matplotlib not importable: %s); the table only", what, err)
        return None
    except Exception as err:  # noqa: BLE001 - a chart is never worth a failed run
        log.warning("%s: no chart (%s: %s); the table only", what, type(err).__name__, err)
        return None
    if len(png) > MAX_CHART_BYTES:
        log.warning("%s: chart left out (%d bytes > %d); the table only", what, len(png), MAX_CHART_BYTES)
        return None
    return png


def plot_markdown(test_set: str, data: dict[str, Any] | None) -> str | None:
    """Markdown with a bar chart of each worker's rate (RTFx per worker-second where the lengths are
    seconds, else items per worker-second; :func:`workers_figure`) over a table of the workers; the
    table alone where no chart could be drawn; None without workers.

    >>> text = plot_markdown("test_a", {"workers": [{"worker": "n1:7", "shards": 2, "items": 30,
    ...     "rtfx_per_worker_s": 5.0, "items_per_worker_s": 1.5}]})
    >>> "data:image/png;base64," in text, "| `n1:7` | 5 | 2 | 30 |" in text
    (True, True)
    """
    import base64

    workers = worker_rows(data)
    if not workers:
        return None
    key = rate_key(workers)
    what = RATES[key][0]
    lines = [f"### {test_set}: {what}, by worker", ""]
    png = chart_png(f"throughput of {test_set}", lambda: workers_figure(test_set, workers))
    if png is not None:
        image = base64.b64encode(png).decode("ascii")
        lines += [f"![{what} by worker](data:image/png;base64,{image})", ""]
    lines += [f"| worker | {what} | shards | items |", "|---|---|---|---|"]
    for w in workers:
        value = "n/a" if w.get(key) is None else f"{w[key]:g}"
        lines.append(f"| `{w['worker']}` | {value} | {w['shards']} | {w['items']} |")
    return "\n".join(lines)


def publish(test_set: str, data: dict[str, Any]) -> None:
    """The per-test-set throughput as Prefect artifacts: a table, one row per worker, the totals above
    it; and the workers' rates as a bar chart (key ``<table key>-plot``)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    rows = worker_rows(data)
    create_table_artifact(
        table=rows or [{"worker": "-"}],
        key=artifact_key(test_set),
        description=f"{test_set}: {throughput_line(data)}; per worker: shards, items, seconds in shards, "
        f"audio seconds, RTFx per worker-second, items per worker-second, GPU busy share",
    )
    plot = plot_markdown(test_set, data)
    if plot is not None:
        create_markdown_artifact(
            markdown=plot, key=f"{artifact_key(test_set)}-plot", description=f"{test_set}: workers"
        )


def write(path: Path, test_set: str, data: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
    """``.throughput.json``: the figures, written whole (atomically)."""
    payload = {"version": THROUGHPUT_VERSION, "test_set": test_set, **(extra or {}), **data}
    with atomic_open(path, "w") as out:
        out.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
