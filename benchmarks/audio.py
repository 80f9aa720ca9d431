"""A benchmark recipe whose items cost real work to load: FSDD recordings read from disk and turned
into log-mel features on every ``dataset[i]``, and a torch model of comparable cost.

- ``FeatureDataset``: item ``i`` is recording ``i % len(recordings)`` (sorted file names; the set is
  cycled to reach ``n`` items), read with ``wave``, resampled to 16 kHz, framed (25 ms windows every
  ``hop_ms``), Hann-windowed, FFT'd and projected on a mel filter bank, log-compressed. Before every
  timed run :func:`evict` drops the recordings from the page cache (``posix_fadvise DONTNEED``) so
  reads touch the disk.
- ``DigitNet``: fixed random weights (seeded): 1-D convolutions over the features, mean pooling,
  a linear layer; one torch thread; returns the arg-max class and the frame count (integers, so
  outputs are byte-identical run to run).

``hop_ms`` sets the loading cost, ``channels``/``layers`` the model's; :func:`calibrate` measures
both per item in this process.
"""

from __future__ import annotations

import glob
import os
import time
import wave
from pathlib import Path

import numpy as np

FSDD = Path(os.environ.get("E3P_FSDD", "/work/shared/data/fsdd/recordings"))
RATE = 16000


def recordings(root: str | Path = FSDD) -> list[str]:
    paths = sorted(glob.glob(str(Path(root) / "*.wav")))
    if not paths:
        raise FileNotFoundError(f"no recordings under {root} (set E3P_FSDD)")
    return paths


def evict(paths) -> None:
    """Drop the files from the page cache, so the next read touches the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _mel_bank(n_fft: int, n_mels: int, rate: int) -> np.ndarray:
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(0.0), mel(rate / 2), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1.0 / rate)
    bank = np.zeros((n_mels, len(bins)), dtype=np.float32)
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        bank[m] = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0.0, None)
    return bank


def read_recording(path: str) -> tuple[np.ndarray, int]:
    with wave.open(path, "rb") as handle:
        rate, frames = handle.getframerate(), handle.readframes(handle.getnframes())
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0, rate


def log_mel(audio: np.ndarray, rate: int, hop_ms: float, n_mels: int = 80, n_fft: int = 512) -> np.ndarray:
    if rate != RATE:  # linear-interpolation resampling to 16 kHz
        positions = np.arange(int(len(audio) * RATE / rate)) * (rate / RATE)
        audio = np.interp(positions, np.arange(len(audio)), audio).astype(np.float32)
    win, hop = int(0.025 * RATE), max(1, int(hop_ms * RATE / 1000))
    if len(audio) < win:
        audio = np.pad(audio, (0, win - len(audio)))
    starts = np.arange(0, len(audio) - win + 1, hop)
    frames = audio[starts[:, None] + np.arange(win)] * np.hanning(win).astype(np.float32)
    power = np.abs(np.fft.rfft(frames, n=n_fft)) ** 2
    return np.log(power.astype(np.float32) @ _bank(n_fft, n_mels).T + 1e-6)


_BANKS: dict = {}


def _bank(n_fft: int, n_mels: int) -> np.ndarray:
    key = (n_fft, n_mels)
    if key not in _BANKS:
        _BANKS[key] = _mel_bank(n_fft, n_mels, RATE)
    return _BANKS[key]


class FeatureDataset:
    """``n`` items over the recordings (cycled); each read decodes and featurizes one file."""

    def __init__(self, n: int, hop_ms: float = 2.5, root: str | None = None):
        self.paths = recordings(root or FSDD)
        self.n, self.hop_ms = n, hop_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict:
        path = self.paths[idx % len(self.paths)]
        audio, rate = read_recording(path)
        return {"utt_id": f"u{idx:06d}", "feats": log_mel(audio, rate, self.hop_ms)}


class FeatureOrganizer:
    def __init__(self, test=()):
        self.test = {t["name"]: FeatureDataset(t["n"], t.get("hop_ms", 2.5), t.get("root")) for t in test}


class DigitNet:
    """Conv1d stack over log-mel frames -> 10 classes; one torch thread, fixed seeded weights."""

    def __init__(self, channels: int = 256, layers: int = 3, device: str = "cpu"):
        import torch

        torch.set_num_threads(1)
        generator = torch.Generator().manual_seed(0)
        shapes = [(channels, 80, 5)] + [(channels, channels, 5)] * (layers - 1)
        self.weights = [torch.randn(*s, generator=generator) / (s[1] * s[2]) ** 0.5 for s in shapes]
        self.head = torch.randn(10, channels, generator=generator) / channels**0.5

    def __call__(self, feats):
        import torch

        if isinstance(feats, list):
            return [self(f) for f in feats]
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(feats.T))[None]
            for weight in self.weights:
                x = torch.relu(torch.nn.functional.conv1d(x, weight, padding=2))
            logits = self.head @ x.mean(dim=2)[0]
        return {"digit": int(torch.argmax(logits)), "frames": int(feats.shape[0])}


def output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "digit": model_output["digit"], "frames": model_output["frames"]}


def config(
    inference_dir: str,
    n: int,
    n_workers: int,
    *,
    hop_ms: float = 2.5,
    channels: int = 256,
    layers: int = 3,
    prefetch: int | None = None,
    batch_size: int | None = None,
) -> dict:
    runner = {"_target_": "espnet3_prefect.espnet3.inference_runner.InferenceRunner"}
    if prefetch is not None:
        runner["prefetch"] = prefetch
    return {
        "inference_dir": inference_dir,
        "dataset": {
            "_target_": "benchmarks.audio.FeatureOrganizer",
            "test": [{"name": "fsdd", "n": n, "hop_ms": hop_ms, "root": str(FSDD)}],
        },
        "model": {"_target_": "benchmarks.audio.DigitNet", "channels": channels, "layers": layers},
        "input_key": "feats",
        "output_fn": "benchmarks.audio.output_fn",
        "batch_size": batch_size,
        "provider": {"_target_": "espnet3_prefect.espnet3.provider.InferenceProvider"},
        "runner": runner,
        "parallel": {"env": "local", "n_workers": n_workers},
    }


def calibrate(n: int = 200, hop_ms: float = 2.5, channels: int = 256, layers: int = 3) -> tuple[float, float]:
    """(load, compute) seconds per item in this process, loading from a cold page cache."""
    dataset = FeatureDataset(n, hop_ms)
    model = DigitNet(channels, layers)
    evict(dataset.paths)
    started = time.perf_counter()
    items = [dataset[i] for i in range(n)]
    load = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for item in items:
        model(item["feats"])
    return load, (time.perf_counter() - started) / n


if __name__ == "__main__":
    import sys

    args = [float(a) for a in sys.argv[1:]]
    hop, channels, layers = (args + [2.5, 256, 3][len(args) :])[:3]
    load, compute = calibrate(hop_ms=hop, channels=int(channels), layers=int(layers))
    print(f"load {load * 1000:.2f} ms/item, compute {compute * 1000:.2f} ms/item")
