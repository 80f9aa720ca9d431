"""One figure per headline benchmark result, for docs/benchmarks.md.

    .venv/bin/python -m benchmarks.figures [--results benchmarks/results/headline.json] [--out docs/_static]

Reads the last recorded headline numbers (``benchmarks/results/headline.json``: transcribed from the
newest result tables of docs/benchmarks.md, each entry naming its section and the command that
measured it) and writes ``bench-<name>.png`` for each: a title, axes labelled with their units, a
legend, and each goal as a dashed line. Drawn on matplotlib's Agg canvas (``Figure``, no pyplot
state) and stored in 64 colours, a few tens of KB each. After a new benchmark run, update the entry
from the run's output (``benchmarks.run --json``, ``benchmarks.throughput --json``,
``benchmarks.server_scale``) and run this again.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from espnet3_prefect.pipeline.throughput import figure_png

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "headline.json"
OUT = ROOT / "docs" / "_static"
UPSTREAM, OURS, OTHER, GOAL = "tab:gray", "tab:blue", "tab:green", "tab:red"


def _figure(width: float = 8.0, height: float = 4.0, panels: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = fig.subplots(1, panels)
    return fig, axes


def _goal_segments(ax, xs, ys, width: float, label: str) -> None:
    """A dashed goal over each group (x +- width), at its own height; one legend entry."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y is not None:
            ax.hlines(
                y, x - width, x + width, colors=GOAL, linestyles="--", linewidth=1.5, label=label if i == 0 else None
            )


def _finish(ax, title: str, xlabel: str, ylabel: str, legend_loc: str = "upper right", ncols: int = 1) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc=legend_loc, fontsize=8, ncols=ncols)


def throughput_cpu(data: dict):
    """Batches by duration against upstream's fixed batch size: wall and padding efficiency per budget."""
    budgets = data["budgets"]
    fig, (wall, pad) = _figure(9.0, 4.0, panels=2)
    xs = range(len(budgets))
    labels = [b["label"] for b in budgets]
    w = 0.36
    wall.bar([x - w / 2 for x in xs], [b["upstream_wall_s"] for b in budgets], w, color=UPSTREAM, label="upstream")
    bars = wall.bar([x + w / 2 for x in xs], [b["ours_wall_s"] for b in budgets], w, color=OURS, label="by duration")
    wall.bar_label(bars, [f"{b['ours_wall_s'] / b['upstream_wall_s']:.2f}x" for b in budgets], padding=2, fontsize=8)
    goal = data["goal_ratio"]
    _goal_segments(
        wall,
        [x + w / 2 for x in xs],
        [goal * b["upstream_wall_s"] for b in budgets],
        w / 2,
        f"goal: <= {goal:g} x upstream",
    )
    wall.set_xticks(list(xs), labels, fontsize=8)
    _finish(wall, "Wall time at the same budget", "budget (seconds of audio per batch)", "wall time (s)")
    pad.bar([x - w / 2 for x in xs], [b["upstream_padding"] for b in budgets], w, color=UPSTREAM, label="upstream")
    bars = pad.bar([x + w / 2 for x in xs], [b["ours_padding"] for b in budgets], w, color=OURS, label="by duration")
    pad.bar_label(bars, [f"{b['ours_padding']:.3f}" for b in budgets], padding=2, fontsize=8)
    pad.axhline(
        data["goal_padding"], color=GOAL, linestyle="--", linewidth=1.5, label=f"goal: >= {data['goal_padding']:g}"
    )
    pad.set_ylim(0, 1.3)
    pad.set_xticks(list(xs), labels, fontsize=8)
    _finish(
        pad,
        "Padding efficiency",
        "budget (seconds of audio per batch)",
        "real / padded length (fraction)",
        "upper center",
        ncols=3,
    )
    fig.suptitle(
        "Issue 40: batches by duration, whole test set sorted, 2 CPU workers (280 items, 695 s of audio)", fontsize=11
    )
    return fig


def throughput_h200(data: dict):
    """The same on one H200: upstream, by duration and the bare loop's wall, `local` and `local_gpu`."""
    runs = data["runs"]
    fig, ax = _figure(8.0, 4.0)
    xs = range(len(runs))
    w = 0.26
    ax.bar([x - w for x in xs], [r["upstream_wall_s"] for r in runs], w, color=UPSTREAM, label="upstream")
    bars = ax.bar(xs, [r["ours_wall_s"] for r in runs], w, color=OURS, label="by duration (flow)")
    ax.bar_label(bars, [f"{r['ours_wall_s'] / r['upstream_wall_s']:.2f}x" for r in runs], padding=2, fontsize=8)
    bare = [(x + w, r["bare_loop_wall_s"]) for x, r in zip(xs, runs) if r.get("bare_loop_wall_s")]
    if bare:
        ax.bar([x for x, _ in bare], [v for _, v in bare], w, color=OTHER, label="bare torch loop, same batches")
    goal = data["goal_ratio"]
    _goal_segments(ax, list(xs), [goal * r["upstream_wall_s"] for r in runs], w / 2, f"goal: <= {goal:g} x upstream")
    ax.set_xticks(list(xs), [r["label"] for r in runs], fontsize=8)
    _finish(
        ax,
        "Issue 40 on one NVIDIA H200: wall time at the same budget (160 items, 335 s of audio)",
        "env, budget",
        "wall time (s)",
    )
    return fig


def shards_by_time(data: dict):
    """Shard wall over the ideal (work / the workers' real capacity), time-sized shards and today's plan."""
    runs = data["runs"]
    fig, ax = _figure(7.0, 3.6)
    xs = range(len(runs))
    w = 0.36
    a = ax.bar([x - w / 2 for x in xs], [r["today"] for r in runs], w, color=UPSTREAM, label="today's plan (32 shards)")
    b = ax.bar([x + w / 2 for x in xs], [r["by_time"] for r in runs], w, color=OURS, label="shards by time (64)")
    for bars in (a, b):
        ax.bar_label(bars, fmt="%.3f", padding=2, fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8, label=f"ideal ({data['ideal_s']:g} s)")
    ax.axhline(data["goal"], color=GOAL, linestyle="--", linewidth=1.5, label=f"goal: <= {data['goal']:g}")
    ax.set_ylim(0.9, 1.25)
    ax.set_xticks(list(xs), [r["label"] for r in runs])
    _finish(
        ax,
        "Shards sized by time, 2 workers, one 3x slower",
        "benchmark run",
        "shard wall / ideal wall (ratio)",
        "upper left",
    )
    return fig


def recorder_capacity(data: dict):
    """Task runs recorded per second against those sent, per server; the goal's rate as a dashed line."""
    fig, ax = _figure(7.0, 4.2)
    top = max(max(s["sent_per_s"]) for s in data["servers"])
    ax.plot([5, top * 1.2], [5, top * 1.2], color="black", linewidth=0.8, label="recorded = sent")
    for server, marker in zip(data["servers"], "osd"):
        ax.plot(
            server["sent_per_s"],
            server["recorded_per_s"],
            marker=marker,
            label=f"{server['label']} (sustained {server['sustained_per_s']}/s)",
        )
    goal = data["goal_per_s"]
    ax.axhline(
        goal,
        color=GOAL,
        linestyle="--",
        linewidth=1.5,
        label=f"goal: {goal:g}/s (10 x a 64-worker run's {data['needed_per_s']:g}/s)",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _finish(
        ax,
        "Issue 39: the server's recorder under load (10-s steps, 4 clients)",
        "task runs sent (per s)",
        "task runs recorded (per s)",
        "upper left",
    )
    return fig


def per_extra_shard(data: dict):
    """Wall per extra shard, ours against plain Dask, per server; plain Dask + the goal's margin dashed."""
    servers = data["servers"]
    fig, ax = _figure(7.0, 3.6)
    xs = range(len(servers))
    w = 0.36
    ax.bar([x - w / 2 for x in xs], [s["plain_dask_ms"] for s in servers], w, color=UPSTREAM, label="plain Dask")
    bars = ax.bar(
        [x + w / 2 for x in xs], [s["ours_ms"] for s in servers], w, color=OURS, label="ours (a task run per shard)"
    )
    ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    margin = data["goal_within_ms"]
    _goal_segments(
        ax, list(xs), [s["plain_dask_ms"] + margin for s in servers], 0.4, f"goal: within {margin:g} ms of plain Dask"
    )
    ax.set_ylim(0, 1.35 * max(s["ours_ms"] for s in servers))
    ax.set_xticks(list(xs), [s["label"] for s in servers], fontsize=8)
    _finish(
        ax,
        "Issue 39: wall per extra shard (2,000-shard run, 4 workers)",
        "server",
        "wall per extra shard (ms)",
        "upper right",
    )
    return fig


def overhead(data: dict):
    """Ours against the ESPnet3 baseline, wall time per group; the goal (<= 1.10 x baseline) dashed."""
    groups = data["groups"]
    fig, ax = _figure(8.5, 4.2)
    xs = range(len(groups))
    w = 0.36
    ax.bar(
        [x - w / 2 for x in xs],
        [g["baseline_s"] for g in groups],
        w,
        color=UPSTREAM,
        label="ESPnet3 baseline (upstream, or its plain-Dask design)",
    )
    bars = ax.bar([x + w / 2 for x in xs], [g["ours_s"] for g in groups], w, color=OURS, label="ours")
    ax.bar_label(bars, [f"{g['ours_s'] / g['baseline_s']:.2f}x" for g in groups], padding=2, fontsize=8)
    _goal_segments(
        ax,
        list(xs),
        [g["goal_ratio"] * g["baseline_s"] if g.get("goal_ratio") else None for g in groups],
        0.4,
        "goal: <= 1.1 x baseline",
    )
    ax.set_ylim(0, 1.3 * max(max(g["ours_s"], g["baseline_s"]) for g in groups))
    ax.set_xticks(list(xs), [g["label"] for g in groups], fontsize=8)
    _finish(
        ax,
        "Ours against the ESPnet3 baseline, 2 workers, 2 cores (labels: ours / baseline)",
        "benchmark group",
        "wall time (s)",
        "upper left",
    )
    return fig


FIGURES: dict[str, tuple[str, Callable]] = {
    "bench-throughput-cpu.png": ("throughput_cpu", throughput_cpu),
    "bench-throughput-h200.png": ("throughput_h200", throughput_h200),
    "bench-shards-by-time.png": ("shards_by_time", shards_by_time),
    "bench-recorder-capacity.png": ("recorder_capacity", recorder_capacity),
    "bench-per-extra-shard.png": ("per_extra_shard", per_extra_shard),
    "bench-overhead.png": ("overhead", overhead),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the headline numbers (JSON)")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for bench-*.png")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (key, draw) in FIGURES.items():
        png = figure_png(draw(results[key]))
        (args.out / name).write_bytes(png)
        print(f"{args.out / name}: {len(png) // 1024} KB")


if __name__ == "__main__":
    main()
