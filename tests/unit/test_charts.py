"""The charts in the UI's artifacts, drawn with matplotlib (Agg, no pyplot): the workers' throughput
(pipeline/throughput.py) and the score trends per run and per checkpoint (metrics/history.py,
checkpoints/trend.py). What each Figure shows (title, axis titles with units, names, one panel per
metric, steps on the x axis, gaps), that the PNG decodes at its size and stays small, and that without
matplotlib the artifact is the table alone."""

from __future__ import annotations

import base64
import io
import logging
import math
import re
import sys

from matplotlib.image import imread

from espnet3_prefect.checkpoints.trend import checkpoint_figure, checkpoint_markdown, write_checkpoint_plot
from espnet3_prefect.metrics.history import trend_markdown, write_plot
from espnet3_prefect.pipeline.throughput import figure_png, plot_markdown, workers_figure

SMALL = 60_000  # bytes: a chart is stored (base64) in Prefect's database with its artifact


def _size(png: bytes) -> tuple[int, int]:
    """(width, height) of the decoded PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(png))
    return pixels.shape[1], pixels.shape[0]


def _inlined(markdown: str) -> bytes | None:
    found = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    return base64.b64decode(found.group(1)) if found else None


def _workers(rates):
    return [
        {
            "worker": f"node{i}.lab:{100 + i}",
            "shards": 2,
            "items": 30,
            "rtfx_per_worker_s": rate,
            "items_per_worker_s": 1.5,
        }
        for i, rate in enumerate(rates)
    ]


def test_the_workers_chart_names_each_worker_and_marks_the_mean():
    workers = _workers([20.0, 5.0, 23.0])
    ax = workers_figure("test_clean", workers).axes[0]
    assert ax.get_title() == "test_clean: RTFx per worker-second, by worker"
    assert ax.get_xlabel() == "worker (host:pid)"
    assert "RTFx per worker-second" in ax.get_ylabel() and "(audio s / worker s)" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["node0.lab:100", "node1.lab:101", "node2.lab:102"]
    assert [bar.get_height() for bar in ax.patches] == [20.0, 5.0, 23.0]
    [mean] = ax.lines  # the dashed mean, across the axes
    assert list(mean.get_ydata()) == [16.0, 16.0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["mean of 3: 16", "RTFx per worker-second of each worker"]
    assert [t.get_text() for t in ax.texts] == ["20", "5", "23"]  # each value above its bar


def test_a_worker_without_seconds_makes_it_items_per_second_and_a_missing_rate_no_bar():
    workers = _workers([20.0, None])
    workers[1]["items_per_worker_s"] = None
    ax = workers_figure("dev", workers).axes[0]
    assert ax.get_title() == "dev: items per worker-second, by worker"
    assert "(items / worker s)" in ax.get_ylabel()
    assert [bar.get_height() for bar in ax.patches] == [1.5, 0.0]
    assert [t.get_text() for t in ax.texts] == ["1.5", "n/a"]
    assert list(ax.lines[0].get_ydata()) == [1.5, 1.5]  # the mean of the workers that have a rate


def test_the_workers_chart_is_a_small_800_by_400_png_in_its_artifact():
    text = plot_markdown("test_clean", {"workers": _workers([20.0 + i % 5 for i in range(16)])})
    png = _inlined(text)
    assert png is not None and _size(png) == (800, 400) and len(png) < SMALL, len(png)
    wide = figure_png(workers_figure("t", _workers([1.0] * 64)))  # past 32 workers the chart widens
    assert _size(wide)[0] > 800 and len(wide) < SMALL


def test_without_matplotlib_the_artifacts_are_the_tables_alone(monkeypatch, caplog, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # ``import`` raises ImportError
    with caplog.at_level(logging.WARNING, logger="espnet3_prefect"):
        text = plot_markdown("test_a", {"workers": _workers([2.0])})
    assert _inlined(text) is None and "| `node0.lab:100` | 2 | 2 | 30 |" in text
    [record] = caplog.records
    assert "no chart (matplotlib not importable" in record.getMessage()
    plot = tmp_path / "evaluate_history.png"
    plot.write_bytes(b"an old chart")  # a stale one is not shown as this run's
    records = [_record(1, {"WER": {"dev": 5.0}})]
    write_plot(records, plot)
    assert not plot.exists()
    text = trend_markdown(records, plot, "first evaluation")
    assert "| 5.00 |" in text and _inlined(text) is None


def _record(i, headline, step=None, epoch=None):
    return {
        "run_time": f"2026-11-{i:02d}T00:00:00+00:00",
        "inference_dir": "exp/asr/inference",
        "model": {"kind": "config", "id": f"{i:016d}"},
        "config_fingerprint": "f" * 64,
        "shards_run": 1,
        "shards_cached": 0,
        "headline": headline,
        "status": "ok",
        "checkpoint": {
            "name": f"c{i}.ckpt",
            "path": f"/c{i}.ckpt",
            "sha256": f"{i:064d}",
            "step": step,
            "epoch": epoch,
        },
    }


def _points():
    """Three checkpoints at steps 1000, 1500, 4000; CER missing on ``other`` at the second."""
    return [
        _record(1, {"WER": {"clean": 9.0, "other": 19.0}, "CER": {"clean": 3.0, "other": 8.0}}, step=1000, epoch=1),
        _record(2, {"WER": {"clean": 7.0, "other": 15.0}, "CER": {"clean": 2.5}}, step=1500, epoch=2),
        _record(3, {"WER": {"clean": 8.0, "other": 14.0}, "CER": {"clean": 2.0, "other": 6.0}}, step=4000, epoch=3),
    ]


def test_the_checkpoint_trend_has_a_panel_per_metric_over_the_training_step():
    fig = checkpoint_figure(_points())
    assert fig.get_suptitle() == "evaluate: scores per checkpoint (3 checkpoints)"
    wer, cer = fig.axes  # one panel, one y axis, per metric
    assert (wer.get_title(), cer.get_title()) == ("WER", "CER")
    assert wer.get_ylabel() == "WER (%, lower is better)" and cer.get_ylabel() == "CER (%, lower is better)"
    assert cer.get_xlabel() == "training step"
    lines = {line.get_label(): line for line in cer.lines}
    assert list(lines["clean"].get_xdata()) == [1000, 1500, 4000]  # spaced by step, not by index
    other = list(lines["other"].get_ydata())
    assert other[0] == 8.0 and math.isnan(other[1]) and other[2] == 6.0  # a gap, not a line across it
    [best] = [line for line in wer.lines if line.get_label() == "best"]  # one legend entry for the rings
    assert best.get_markerfacecolor() == "none"
    rings = [(line.get_xdata()[0], line.get_ydata()[0]) for line in wer.lines if line.get_markerfacecolor() == "none"]
    assert rings == [(1500, 7.0), (4000, 14.0)]  # the lowest WER of each test set
    assert [t.get_text() for t in wer.get_legend().get_texts()] == ["clean", "other", "best"]


def test_without_steps_the_x_axis_is_the_checkpoint_number_and_says_so():
    points = _points()
    for point in points:
        point["checkpoint"]["step"] = point["checkpoint"]["epoch"] = None
    fig = checkpoint_figure(points)
    assert fig.axes[-1].get_xlabel() == "checkpoint # in the order scored (training steps unknown)"
    assert list(fig.axes[0].lines[0].get_xdata()) == [1, 2, 3]
    points[0]["checkpoint"]["epoch"], points[1]["checkpoint"]["epoch"], points[2]["checkpoint"]["epoch"] = 1, 2, 5
    assert checkpoint_figure(points).axes[-1].get_xlabel() == "epoch (training steps unknown)"


def test_the_trend_pngs_decode_at_their_size_and_are_inlined(tmp_path):
    points = _points()
    plot = tmp_path / "evaluate_checkpoints.png"
    assert write_checkpoint_plot(points, plot) == [
        ("WER", "clean"),
        ("WER", "other"),
        ("CER", "clean"),
        ("CER", "other"),
    ]
    png = plot.read_bytes()
    assert _size(png) == (800, 650) and len(png) < SMALL, len(png)  # two panels
    text = checkpoint_markdown(points, points[-1], plot)
    assert _inlined(text) == png and "one panel per metric; the best point ringed in black" in text

    history = tmp_path / "evaluate_history.png"
    records = [_record(i, {"WER": {"dev": 10.0 - i} if i != 3 else {}}) for i in range(1, 26)]
    assert write_plot(records, history) == [("WER", "dev")]
    png = history.read_bytes()
    assert _size(png) == (800, 400) and len(png) < SMALL, len(png)  # one panel
    assert _inlined(trend_markdown(records, history, "ok")) == png


def test_the_run_trend_numbers_the_runs_and_breaks_at_a_missing_score():
    from espnet3_prefect.metrics.history import trend_figure

    fig = trend_figure("t", [6, 7, 8], "evaluate run (oldest left)", [("WER", "dev")], [[5.0, None, 4.0]])
    [ax] = fig.axes
    assert ax.get_title() == "WER on dev"  # one series: named in the title, and in the legend (every chart has one)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dev"]
    assert ax.get_xlabel() == "evaluate run (oldest left)" and list(ax.lines[0].get_xdata()) == [6, 7, 8]
    assert math.isnan(ax.lines[0].get_ydata()[1])
    [bleu] = trend_figure("t", [1], "x", [("BLEU", "dev")], [[30.0]]).axes
    assert bleu.get_ylabel() == "BLEU (higher is better)"
