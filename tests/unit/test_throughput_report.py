"""RTFx and where the time went (pipeline/throughput.py): shard summaries booked per worker, the figures
per test set and per worker, what is said when the lengths are not seconds, the summary line, the file;
and the GPU sampler's no-GPU path (pipeline/gpu_busy.py)."""

from __future__ import annotations

import json

from espnet3_prefect.pipeline.gpu_busy import GpuBusy
from espnet3_prefect.pipeline.report import add_timing, empty_timing, format_summary, summary_rows
from espnet3_prefect.pipeline.throughput import figures, of_summary, throughput_line, write


def _shard(host, pid, items, seconds, real, padded, gpu=None):
    out = {"host": host, "pid": pid, "items": items, "seconds": seconds, "timing": {"forward_s": seconds}}
    out["padding"] = {"batches": 2, "real": real, "padded": padded}
    if gpu:
        out["gpu_busy"] = {"device": 0, "samples": gpu[0], "busy": gpu[1]}
    return out


def _summary(unit="s", gpu=False):
    timing = empty_timing()
    add_timing(timing, _shard("n1", 10, 10, 2.0, 30.0, 40.0, (10, 0.5) if gpu else None))
    add_timing(timing, _shard("n1", 10, 10, 2.0, 30.0, 35.0, (30, 0.9) if gpu else None))
    add_timing(timing, _shard("n2", 11, 20, 5.0, 60.0, 75.0))
    timing["wall_s"] = 6.0
    summary = {"test_set": "t", "shards": 3, "items": 40, "shards_run": 3, "shards_cached": 0, "seconds": 7.0}
    return {**summary, "timing": timing, "workers": 2, "items_run": 40, "lengths": {"source": "x", "unit": unit}}


def test_figures_per_test_set_and_per_worker():
    data = of_summary(_summary(gpu=True))
    assert data["audio_s"] == 120.0 and data["rtfx"] == 20.0  # 120 s of audio in 6 s of wall
    assert data["rtfx_per_worker_s"] == round(120.0 / 9.0, 3) and data["items_per_s"] == round(40 / 6.0, 3)
    assert data["padding_efficiency"] == round(120.0 / 150.0, 3)
    n1, n2 = data["workers"]
    assert (n1["worker"], n1["shards"], n1["items"], n1["busy_s"], n1["audio_s"]) == ("n1:10", 2, 20, 4.0, 60.0)
    assert n1["rtfx_per_worker_s"] == 15.0 and n2["rtfx_per_worker_s"] == 12.0 and n2["items_per_worker_s"] == 4.0
    assert n1["gpu_busy"] == round((10 * 0.5 + 30 * 0.9) / 40, 4) and n2["gpu_busy"] is None
    assert data["gpu_busy"] == n1["gpu_busy"]  # only the GPU samples there are


def test_lengths_not_in_seconds_give_items_per_second_and_padding_but_no_rtfx():
    for unit, why in (("samples", "lengths in samples, not seconds"), (None, "lengths in the dataset units")):
        data = of_summary(_summary(unit=unit))
        assert data["rtfx"] is None and data["audio_s"] is None and data["items_per_s"] is not None
        assert data["padding_efficiency"] == 0.8 and all(w["audio_s"] is None for w in data["workers"])
        assert why in throughput_line(data)
    unknown = figures({"wall_s": 2.0, "busy_s": 2.0}, items_run=4, unit=None)
    assert unknown["padding_efficiency"] is None and "item lengths unknown" in throughput_line(unknown)


def test_the_summary_says_it_and_a_cached_test_set_has_no_figures(tmp_path):
    summary = _summary()
    text = format_summary([summary])
    assert "throughput: RTFx 20.0 (13.3 per worker-second; 120.0 s of audio in 6.0 s), padding efficiency 0.80" in text
    [row] = summary_rows([summary])
    assert row["rtfx"] == 20.0 and row["padding_efficiency"] == 0.8 and row["gpu_busy"] is None
    cached = {**summary, "shards_run": 0, "shards_cached": 3, "timing": None}
    assert of_summary(cached) is None and "throughput" not in format_summary([cached])
    write(tmp_path / ".throughput.json", "t", of_summary(summary), {"max_duration": None})
    data = json.loads((tmp_path / ".throughput.json").read_text())
    assert data["version"] == 1 and data["test_set"] == "t" and data["rtfx"] == 20.0 and len(data["workers"]) == 2


def test_the_gpu_sampler_claims_nothing_without_a_gpu_and_leaves_no_thread():
    import threading
    import time

    import pytest

    torch = pytest.importorskip("torch")
    with GpuBusy(every_s=0.01) as gpu:
        if torch.cuda.is_available():  # a GPU worker: keep it busy for a few samples
            x = torch.randn(2048, 2048, device="cuda")
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                x = (x @ x).tanh()
            torch.cuda.synchronize()
    if torch.cuda.is_available() and gpu.device is not None:
        assert gpu.result()["samples"] >= 1 and 0.0 <= gpu.result()["busy"] <= 1.0
    else:
        assert gpu.result() is None  # no GPU (or no NVML): the summary claims nothing
    assert "e3p-gpu-busy" not in {t.name for t in threading.enumerate()}


def test_on_a_gpu_the_sampler_tells_a_busy_device_from_an_idle_one():
    """NVML's counter on a real device: a second of back-to-back matmuls reads mostly busy, a second
    of sleep mostly idle (the GPU part of issue 40, run by benchmarks/gpu_payload/oom_check.sh)."""
    import importlib.util
    import time

    import pytest

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or importlib.util.find_spec("pynvml") is None:
        pytest.skip("needs a CUDA GPU and nvidia-ml-py (pip install 'espnet3-prefect[gpu]')")
    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    time.sleep(1.0)  # NVML averages over its own period: let the warm-up leave it
    with GpuBusy(every_s=0.05) as idle:
        time.sleep(1.0)
    with GpuBusy(every_s=0.05) as busy:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            x = (x @ x).tanh()
        torch.cuda.synchronize()
    assert idle.result()["samples"] >= 5 and busy.result()["samples"] >= 5
    assert busy.result()["busy"] > 0.5 > idle.result()["busy"], (busy.result(), idle.result())


def test_the_workers_plot_artifact_names_its_rate_and_lists_the_workers():
    """The chart itself: tests/unit/test_charts.py."""
    from espnet3_prefect.pipeline.throughput import plot_markdown

    data = {
        "workers": [
            {"worker": "n1:7", "shards": 3, "items": 40, "rtfx_per_worker_s": None, "items_per_worker_s": 2.5},
            {"worker": "n2:9", "shards": 1, "items": 10, "rtfx_per_worker_s": None, "items_per_worker_s": 0.5},
        ]
    }
    text = plot_markdown("test_a", data)
    assert text.startswith("### test_a: items per worker-second, by worker")  # lengths not in seconds
    assert "data:image/png;base64," in text
    assert "| `n1:7` | 2.5 | 3 | 40 |" in text and "| `n2:9` | 0.5 | 1 | 10 |" in text
    assert plot_markdown("test_a", {"workers": []}) is None
