"""Shards sized by time against today's plan, with one slow worker (issue 40, item 2).

10,000 utterances with log-normal lengths (longest / shortest > 100), batches of 8, a model whose cost
is the batch's padded length (longest x count x ``unit_ms``), 2 local workers, one of them 3x slower
(after each ``forward`` it sleeps twice as long as the forward took: :class:`SlowOnOneWorker`, read
from the Dask worker's name). Today's plan (32 shards balanced on ``lengths()``) against
``parallel.shard_duration`` (shards of about that much length, handed out longest first). Both walls
against the ideal: the work (the padded cost of every batch on a normal worker) over the two workers'
real capacity (1 + 1/3 of a normal worker).

The model's cost is a sleep, not a computation: what is measured is where the shards go and when,
and a sleep keeps that apart from the CPU the 2-core machine's other work takes. Run alone:

    .venv/bin/python -m benchmarks.run --only shards_by_time
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from espnet3_prefect.espnet3.inference_runner import InferenceRunner

from . import synthetic

if TYPE_CHECKING:
    from .run import Suite

BATCH_SIZE = 8
SLOW_FACTOR = 3.0  # the slow worker takes this long for what a normal worker does in 1


class PaddedCostModel:
    """Sleeps the padded length of its batch (longest ``cost_ms`` x count); returns ``x % 97`` per item."""

    def __init__(self, device: str = "cpu"):
        pass

    def __call__(self, x, cost_ms):
        if not isinstance(x, list):
            x, cost_ms = [x], [cost_ms]
        time.sleep(max(cost_ms) * len(cost_ms) / 1000.0)
        return [v % 97 for v in x]


def _worker_name() -> str | None:
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except ValueError:  # not on a Dask worker
        return None


class SlowOnOneWorker(InferenceRunner):
    """The ESPnet3 inference runner; on the Dask worker named ``slow_worker`` (a provider param) each
    ``forward`` is followed by a sleep of ``SLOW_FACTOR - 1`` times its own duration."""

    @staticmethod
    def forward(idx, slow_worker=None, **env):
        started = time.perf_counter()
        out = InferenceRunner.forward(idx, **env)
        if slow_worker is not None and _worker_name() == str(slow_worker):
            time.sleep((SLOW_FACTOR - 1) * (time.perf_counter() - started))
        return out


def output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "y": str(model_output)}


def config(inference_dir: str, n: int, unit_ms: float, parallel: dict) -> dict:
    return {
        "inference_dir": inference_dir,
        "dataset": {
            "_target_": "benchmarks.synthetic.UnevenOrganizer",
            "test": [{"name": "bench", "n": n, "unit_ms": unit_ms, "lengths": True, "seed": 4}],
        },
        "model": {"_target_": "benchmarks.shard_time.PaddedCostModel"},
        "input_key": ["x", "cost_ms"],
        "output_fn": "benchmarks.shard_time.output_fn",
        "batch_size": BATCH_SIZE,
        "provider": {"_target_": "espnet3_prefect.espnet3.provider.InferenceProvider", "params": {"slow_worker": 1}},
        "runner": {"_target_": "benchmarks.shard_time.SlowOnOneWorker"},
        "parallel": {"env": "local", "n_workers": 2, **parallel},
    }


def padded_work_s(lengths: list[float], unit_ms: float) -> float:
    """Seconds of model time on a normal worker: each batch's longest item x its count x ``unit_ms``.

    >>> padded_work_s([1.0, 3.0, 2.0], 1000.0)
    9.0
    """
    total = 0.0
    for first in range(0, len(lengths), BATCH_SIZE):
        batch = lengths[first : first + BATCH_SIZE]
        total += max(batch) * len(batch)
    return total * unit_ms / 1000.0


def shards_by_time(s: Suite) -> None:
    n = 2000 if s.quick else 10_000
    # ~170 s of padded work at 10,000 items (~125 s of ideal wall on 1 + 1/3 workers): a shard of 1/64
    # of it takes ~2.6 s, well above the ~0.1-0.25 s a task run costs on this loaded 2-core machine
    unit_ms = 12.0
    lengths = synthetic.UnevenDatasetWithLengths(n, unit_ms, seed=4).lengths()
    work = padded_work_s(lengths, unit_ms)
    ideal = work / (1 + 1 / SLOW_FACTOR)
    shard_duration = round(sum(lengths) / 64, 1)  # ~64 shards: twice today's 32
    walls, summaries = {}, {}
    for label, parallel in (("today", {}), ("by time", {"shard_duration": shard_duration})):
        name = "st_today" if label == "today" else "st_time"
        path = s.write_config(name, config(str(s.work / name), n, unit_ms, parallel))
        walls[label], summaries[label] = s.infer_config(path)
    same = (s.work / "st_today/bench/y.scp").read_bytes() == (s.work / "st_time/bench/y.scp").read_bytes()
    spread = max(lengths) / min(lengths)
    for label in ("today", "by time"):
        timing, summary = summaries[label]["timing"], summaries[label]
        s.record(
            "shards_by_time",
            f"{label}: shard wall / (work / real capacity)",
            timing["wall_s"] / ideal,
            "<= 1.15" if label == "by time" else "",
            f"{summary['shards']} shards; {timing['wall_s']:.1f} s vs {ideal:.1f} s (work {work:.1f} s on 1 + 1/3 "
            f"workers); flow {walls[label]:.1f} s" + ("; outputs identical" if same else "; OUTPUTS DIFFER"),
        )
    s.record(
        "shards_by_time",
        "by time / today, shard wall",
        summaries["by time"]["timing"]["wall_s"] / summaries["today"]["timing"]["wall_s"],
        note=f"{n} items, longest / shortest {spread:.0f}, batch {BATCH_SIZE}, one worker {SLOW_FACTOR:g}x slower, "
        f"shard_duration {shard_duration:g}",
    )
