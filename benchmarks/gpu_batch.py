"""Batch inference on one GPU: ``infer`` with ``env: local_gpu`` against a bare torch loop, same data.

    python -m benchmarks.gpu_batch [--n 20000] [--batch 64] [--channels 2048] [--layers 24] [--hop-ms 2.5]
    python -m benchmarks.gpu_batch --device cpu --env local --n 400 --channels 64 --layers 2   # no GPU

One JSON line per run, then a table. The data are the FSDD recordings (``benchmarks.audio``: read
with ``wave`` and turned into log-mel features on every ``dataset[i]``, on the CPU); the model is
:class:`BatchDigitNet`, a conv1d stack run on the GPU over a padded batch. The runs, on the same
items in the same batches of ``--batch``:

- ``bare``: a fresh process that reads a batch, runs the model on it, reads the next (no overlap);
- ``bare_thread``: the same loop with one reader thread two batches ahead, the overlap our
  ``runner.prefetch: 2`` (the default) gives;
- ``infer#1``, ``infer_prefetch0``, ``infer#2``: the ``infer`` flow on one embedded server,
  ``parallel.env`` ``--env`` (default ``local_gpu``: dask-cuda, one worker), ``runner.prefetch`` 2
  (the process's first flow), 0, then 2 again (a later flow).

``wall_s`` is the whole run as a user waits for it: for ``bare*`` the process from its start
(imports, CUDA context, model) to its last result; for ``infer*`` the flow call, the cluster's
start and the workers' imports included, the server already up (as in ``benchmarks.flow_rounds``).
``gpu_busy`` is the GPU's utilisation (the share of time a kernel ran, NVML, sampled every 20 ms)
averaged over ``wall_s``; ``steady_items_per_s`` counts items between the first and the last result
(``bare*``) or is the items over the shards' summed wall (``infer*``). ``same_outputs`` compares
every utterance's arg-max digit with ``bare``'s. Without NVML (no GPU), ``gpu_busy`` is null.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from .audio import FSDD, FeatureDataset, evict

ROOT = Path(__file__).resolve().parents[1]


class BatchDigitNet:
    """Conv1d stack over padded log-mel batches -> 10 classes, on ``device``; fixed seeded weights.

    Padding is masked after every layer, so an item's result does not depend on its batch.

    >>> import numpy as np
    >>> net = BatchDigitNet(channels=8, layers=2)
    >>> feats = [np.ones((12, 80), np.float32), np.zeros((7, 80), np.float32)]
    >>> [r["frames"] for r in net(feats)], net(feats[1]) == net(feats)[1]
    ([12, 7], True)
    """

    def __init__(self, channels: int = 2048, layers: int = 24, device: str = "cpu"):
        import torch

        self.device = torch.device(device)
        generator = torch.Generator(self.device).manual_seed(0)  # drawn where they live: no host copy

        def draw(*shape):
            return torch.randn(*shape, generator=generator, device=self.device) / math.prod(shape[1:]) ** 0.5

        shapes = [(channels, 80, 5)] + [(channels, channels, 5)] * (layers - 1)
        self.weights = [draw(*s) for s in shapes]
        self.head = draw(10, channels)

    def __call__(self, feats):
        import torch

        single = not isinstance(feats, list)
        batch = [feats] if single else feats
        frames = [int(f.shape[0]) for f in batch]
        padded = np.zeros((len(batch), 80, max(frames)), np.float32)
        for row, f in enumerate(batch):
            padded[row, :, : f.shape[0]] = f.T
        with torch.inference_mode():
            x = torch.from_numpy(padded).to(self.device, non_blocking=True)
            lengths = torch.tensor(frames, device=self.device)
            mask = (torch.arange(x.shape[2], device=self.device)[None, :] < lengths[:, None])[:, None, :].to(x.dtype)
            for weight in self.weights:
                x = torch.relu(torch.nn.functional.conv1d(x, weight, padding=2)) * mask
            digits = torch.argmax((x.sum(dim=2) / lengths[:, None]) @ self.head.T, dim=1).tolist()
        results = [{"digit": d, "frames": n} for d, n in zip(digits, frames)]
        return results[0] if single else results


def output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "digit": model_output["digit"]}


def config(inference_dir: str, args, prefetch: int) -> dict:
    return {
        "inference_dir": inference_dir,
        "dataset": {
            "_target_": "benchmarks.audio.FeatureOrganizer",
            "test": [{"name": "fsdd", "n": args.n, "hop_ms": args.hop_ms, "root": str(FSDD)}],
        },
        "model": {"_target_": "benchmarks.gpu_batch.BatchDigitNet", "channels": args.channels, "layers": args.layers},
        "input_key": "feats",
        "output_fn": "benchmarks.gpu_batch.output_fn",
        "output_keys": ["digit"],
        "batch_size": args.batch,
        "provider": {"_target_": "espnet3_prefect.espnet3.provider.InferenceProvider"},
        "runner": {"_target_": "espnet3_prefect.espnet3.inference_runner.InferenceRunner", "prefetch": prefetch},
        "parallel": {"env": args.env, "n_workers": 1},
    }


# -- the bare loop (run in a fresh process: ``--bare``) ------------------------------------------------
def bare_loop(args) -> dict:
    """Read batch, forward, repeat (``--reader-thread``: a thread reads two batches ahead)."""
    dataset = FeatureDataset(args.n, args.hop_ms)
    model = BatchDigitNet(args.channels, args.layers, args.device)
    batches = [range(s, min(s + args.batch, args.n)) for s in range(0, args.n, args.batch)]

    def read(batch):
        return [dataset[i] for i in batch]

    if args.reader_thread:
        ahead: queue.Queue = queue.Queue(maxsize=2)
        threading.Thread(target=lambda: [ahead.put(read(b)) for b in batches], daemon=True).start()
        fetch = lambda _: ahead.get()  # noqa: E731
    else:
        fetch = read
    digits: dict[str, int] = {}
    first = None
    for batch in batches:
        items = fetch(batch)
        for item, result in zip(items, model([item["feats"] for item in items])):
            digits[item["utt_id"]] = result["digit"]
        first = first or (time.perf_counter(), len(digits))
    steady = (len(digits) - first[1]) / max(1e-9, time.perf_counter() - first[0])
    return {"digits": digits, "steady_items_per_s": round(steady, 1)}


# -- the parent: GPU sampling, runs, comparison ----------------------------------------------------------
class GpuSampler:
    """Mean NVML GPU utilisation (%) between :meth:`start` and :meth:`stop`; None without NVML."""

    def __init__(self, interval_s: float = 0.02):
        self.interval_s, self.samples, self.handle = interval_s, [], None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle, self.nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
        except Exception:  # no NVML here: no GPU numbers
            pass

    def start(self) -> None:
        self.samples, self.stopping = [], threading.Event()
        if self.handle is not None:
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()

    def _poll(self) -> None:
        while not self.stopping.wait(self.interval_s):
            self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def stop(self) -> float | None:
        self.stopping.set()
        if self.handle is None:
            return None
        self.thread.join()
        return round(sum(self.samples) / max(1, len(self.samples)) / 100, 3)


def run_bare(args, work: Path, sampler: GpuSampler, reader_thread: bool) -> dict:
    out = work / f"bare{int(reader_thread)}.json"
    command = [sys.executable, "-m", "benchmarks.gpu_batch", "--bare", str(out), *_shared_args(args)]
    evict(FeatureDataset(1).paths)
    sampler.start()
    started = time.perf_counter()
    subprocess.run(command + (["--reader-thread"] if reader_thread else []), check=True, cwd=ROOT)
    wall = time.perf_counter() - started
    busy = sampler.stop()
    result = json.loads(out.read_text())
    row = {"run": "bare_thread" if reader_thread else "bare", "wall_s": round(wall, 2), "gpu_busy": busy}
    return row | {"steady_items_per_s": result["steady_items_per_s"], "digits": result["digits"]}


def run_infer(args, work: Path, sampler: GpuSampler, prefetch: int, name: str) -> dict:
    import yaml

    from espnet3_prefect.flows.infer import infer

    out_dir = work / name.replace("#", "")
    path = work / f"{out_dir.name}.yaml"
    path.write_text(yaml.safe_dump(config(str(out_dir), args, prefetch)))
    evict(FeatureDataset(1).paths)
    sampler.start()
    started = time.perf_counter()
    infer(config=[str(path)])
    wall = time.perf_counter() - started
    busy = sampler.stop()
    digits = {}
    for line in (out_dir / "fsdd" / "digit.scp").read_text().splitlines():
        utt, digit = line.split(maxsplit=1)
        digits[utt] = int(digit)
    summed = sum(_shard_walls(out_dir))
    steady = args.n / summed if summed else None
    row = {"run": name, "wall_s": round(wall, 2), "gpu_busy": busy}
    return row | {"steady_items_per_s": round(steady, 1) if steady else None, "digits": digits}


def _shard_walls(out_dir: Path) -> list[float]:
    """Each shard's seconds, from its done marker."""
    walls = []
    for marker in out_dir.glob("fsdd/split.*/done"):
        value = json.loads(marker.read_text()).get("seconds")
        if isinstance(value, (int, float)):
            walls.append(float(value))
    return walls


def _shared_args(args) -> list[str]:
    keys = ("n", "batch", "channels", "layers", "hop_ms", "device")
    return [item for k in keys for item in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--channels", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hop-ms", type=float, default=2.5)
    parser.add_argument("--device", default="cuda:0", help="the bare loop's device (infer picks its own)")
    parser.add_argument("--env", default="local_gpu", help="parallel.env of the infer runs")
    parser.add_argument("--bare", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--reader-thread", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        Path(args.bare).write_text(json.dumps(bare_loop(args)))
        return
    from espnet3_prefect.server.embedded import prefect_api

    work, sampler, rows = Path(tempfile.mkdtemp(prefix="e3p-gpu-")), GpuSampler(), []
    with prefect_api(work / "home", ui=False):
        runs = [lambda: run_bare(args, work, sampler, False), lambda: run_bare(args, work, sampler, True)]
        runs += [lambda: run_infer(args, work, sampler, 2, "infer#1")]
        runs += [lambda: run_infer(args, work, sampler, 0, "infer_prefetch0")]
        runs += [lambda: run_infer(args, work, sampler, 2, "infer#2")]
        for run in runs:
            row = run()
            digits = row.pop("digits")
            reference = rows[0]["_digits"] if rows else digits
            row["same_outputs"] = digits == reference
            row["differing"] = sum(1 for u, d in reference.items() if digits.get(u) != d)
            print(json.dumps(row), flush=True)
            rows.append(row | {"_digits": digits})
    bare = rows[0]["wall_s"]
    print(f"\n{'run':<16} {'wall_s':>8} {'/ bare':>7} {'gpu_busy':>9} {'steady it/s':>12} same_outputs")
    for row in rows:
        busy = "n/a" if row["gpu_busy"] is None else f"{row['gpu_busy']:.3f}"
        print(
            f"{row['run']:<16} {row['wall_s']:>8.2f} {row['wall_s'] / bare:>7.2f} {busy:>9} "
            f"{row['steady_items_per_s'] or 0:>12.1f} {row['same_outputs']}"
        )
    print(f"n={args.n} batch={args.batch} channels={args.channels} layers={args.layers} hop_ms={args.hop_ms}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
