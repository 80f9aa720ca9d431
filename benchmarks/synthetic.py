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
        "input_key": "x",
        "output_fn": "benchmarks.synthetic.spin_output_fn",
        "provider": {"_target_": "espnet3_prefect.espnet3.provider.InferenceProvider"},
        "runner": {"_target_": "espnet3_prefect.espnet3.inference_runner.InferenceRunner"},
        "parallel": parallel,
    }


# -- uneven utterances (the load-balance benchmark) ---------------------------------------------------
def uneven_lengths(n: int, seed: int = 0, sigma: float = 0.8) -> list[float]:
    """Log-normal lengths, sorted ascending (test sets are often sorted by length for batching),
    rounded to 1e-4 so they are exact in YAML."""
    import numpy as np

    values = np.sort(np.random.default_rng(seed).lognormal(0.0, sigma, n))
    return [round(float(v), 4) for v in values]


class UnevenDataset:
    """Items ``{"utt_id", "x", "cost_ms"}`` whose forward cost is ``length * unit_ms``; no ``lengths()``."""

    def __init__(self, n: int, unit_ms: float, seed: int = 0):
        self.n, self.unit_ms = n, unit_ms
        self._lengths = uneven_lengths(n, seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        return {"utt_id": f"u{idx:08d}", "x": idx, "cost_ms": self._lengths[idx] * self.unit_ms}


class UnevenDatasetWithLengths(UnevenDataset):
    """The same items, and ``lengths()``: the plan balances shards on them."""

    def lengths(self) -> list[float]:
        return list(self._lengths)


class UnevenOrganizer:
    def __init__(self, test=()):
        self.test = {
            t["name"]: (UnevenDatasetWithLengths if t.get("lengths") else UnevenDataset)(
                t["n"], t["unit_ms"], t.get("seed", 0)
            )
            for t in test
        }


class CostModel:
    """Busy-waits the item's own ``cost_ms``; returns ``x % 97``."""

    def __init__(self, device: str = "cpu"):
        pass

    def __call__(self, x, cost_ms):
        if isinstance(x, list):
            return [self(v, c) for v, c in zip(x, cost_ms)]
        end = time.perf_counter() + cost_ms / 1000.0
        while time.perf_counter() < end:
            pass
        return x % 97


def uneven_config(inference_dir: str, n: int, unit_ms: float, n_workers: int, lengths: bool) -> dict:
    return {
        "inference_dir": inference_dir,
        "dataset": {
            "_target_": "benchmarks.synthetic.UnevenOrganizer",
            "test": [{"name": "bench", "n": n, "unit_ms": unit_ms, "lengths": lengths}],
        },
        "model": {"_target_": "benchmarks.synthetic.CostModel"},
        "input_key": ["x", "cost_ms"],
        "output_fn": "benchmarks.synthetic.spin_output_fn",
        "provider": {"_target_": "espnet3_prefect.espnet3.provider.InferenceProvider"},
        "runner": {"_target_": "espnet3_prefect.espnet3.inference_runner.InferenceRunner"},
        "parallel": {"env": "local", "n_workers": n_workers},
    }
