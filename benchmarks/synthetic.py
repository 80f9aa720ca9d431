"""A synthetic recipe for benchmarks: N integer items, a forward that burns a fixed CPU time."""

from __future__ import annotations

import time


class SpinDataset:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        return {"utt_id": f"u{idx:08d}", "x": idx}


class SpinOrganizer:
    def __init__(self, test=()):
        self.test = {t["name"]: SpinDataset(t["n"]) for t in test}


class SpinModel:
    """Busy-waits ``cost_ms`` per item (CPU-bound, like a small model), returns x % 97."""

    def __init__(self, cost_ms: float = 0.0, device: str = "cpu"):
        self.cost_s = cost_ms / 1000.0

    def __call__(self, x):
        if isinstance(x, list):
            return [self(v) for v in x]
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return x % 97


def spin_output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [spin_output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "y": model_output}


def config(inference_dir: str, n: int, cost_ms: float, n_workers: int, num_shards: int | None) -> dict:
    parallel = {"env": "local", "n_workers": n_workers}
    if num_shards:
        parallel["num_shards"] = num_shards
    return {
        "inference_dir": inference_dir,
        "dataset": {"_target_": "benchmarks.synthetic.SpinOrganizer", "test": [{"name": "bench", "n": n}]},
        "model": {"_target_": "benchmarks.synthetic.SpinModel", "cost_ms": cost_ms},
        "input_key": "x", "output_fn": "benchmarks.synthetic.spin_output_fn",
        "provider": {"_target_": "espnet3_prefect.provider.InferenceProvider"},
        "runner": {"_target_": "espnet3_prefect.runner.InferenceRunner"},
        "parallel": parallel,
    }
