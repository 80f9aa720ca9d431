"""A workload that is not inference: log-mel features + global mean/variance over the DTMF demo audio.

Written the ESPnet3 way, as a provider (builds the dataset and the feature extractor on each worker)
and a runner (one static ``forward`` over indices, per-shard writer hooks, a ``merge``), so the
same code runs in one process or as the Prefect flow ``run-runner`` on any Dask backend
(``python -m dtmf_demo.stats``). Per shard ``split.N/``:

* ``feats/<utt_id>.npy``  float32 ``[frames, n_mels]`` log-mel features (one file per utterance)
* ``feats.scp`` / ``feats_shape``  ``<utt_id> <absolute .npy path>`` / ``<utt_id> <frames>,<n_mels>``
* ``stats_partial.json``  the shard's frame count and float64 per-dimension sums of x and x**2,
  written by ``close_writers``

``merge`` concatenates the SCP and shape files in shard order and sums the partial sums, in float64,
into ``feats_stats.npz`` (ESPnet's ``count`` / ``sum`` / ``sum_square`` keys, written byte for
byte the same for the same numbers) and ``stats.json`` (count, mean, var, std). For a given shard
plan (which does not depend on ``n_workers`` or the backend) every merged file is byte-identical;
with another shard count only the order of the float64 additions changes, so the statistics agree
to rounding (relative 1e-12 here), and every feature file is identical.

>>> ex = LogMel(n_mels=4)
>>> ex(np.zeros(800, np.float32)).shape
(7, 4)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dtmf_demo.dtmf import read_corpus, read_wav
from espnet3_prefect._internal.atomic import atomic_open, atomic_write_text
from espnet3_prefect.disk.concat import concat_files
from espnet3_prefect.espnet3.provider import EnvironmentProvider
from espnet3_prefect.espnet3.runner import BaseRunner

LOG_FLOOR = 1e-10


class LogMel:
    """Log mel filter-bank energies in torch: Hann-windowed frames -> power spectrum -> HTK mel
    triangles -> ``log(max(energy, 1e-10))``. Deterministic: computed with one intra-op thread, one
    utterance at a time, so a feature never depends on the batch, the shard or the worker it ran on."""

    def __init__(
        self,
        sample_rate_hz: int = 8000,
        n_fft: int = 256,
        win_length: int = 200,
        hop_length: int = 80,
        n_mels: int = 23,
        fmin_hz: float = 20.0,
        fmax_hz: float | None = None,
    ):
        if not 0 < win_length <= n_fft:
            raise ValueError(f"features: need 0 < win_length <= n_fft, got {win_length}, {n_fft}")
        self.sample_rate_hz, self.n_fft, self.win_length, self.hop_length = (
            sample_rate_hz,
            n_fft,
            win_length,
            hop_length,
        )
        self.n_mels = n_mels
        window = torch.hann_window(win_length, periodic=True, dtype=torch.float64)
        left = (n_fft - win_length) // 2
        self.window = torch.nn.functional.pad(window, (left, n_fft - win_length - left)).float()
        self.mel = torch.from_numpy(
            mel_matrix(sample_rate_hz, n_fft, n_mels, fmin_hz, fmax_hz or sample_rate_hz / 2)
        ).float()  # [n_mels, n_fft//2+1]

    def __call__(self, wave: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
        if x.shape[0] < self.n_fft:
            x = torch.nn.functional.pad(x, (0, self.n_fft - x.shape[0]))
        with _one_thread(), torch.no_grad():
            spec = torch.stft(
                x, self.n_fft, hop_length=self.hop_length, window=self.window, center=False, return_complex=True
            )  # [freqs, frames]
            power = spec.real**2 + spec.imag**2
            feats = torch.log(torch.clamp(self.mel @ power, min=LOG_FLOOR)).T.contiguous()
        return feats.numpy()


def mel_matrix(sample_rate_hz: int, n_fft: int, n_mels: int, fmin_hz: float, fmax_hz: float) -> np.ndarray:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters, evenly spaced on the HTK mel scale.

    >>> m = mel_matrix(8000, 256, 23, 20.0, 4000.0); m.shape, bool((m >= 0).all())
    ((23, 129), True)
    """

    def to_mel(hz):
        return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)

    def to_hz(mel):
        return 700.0 * (10.0 ** (np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)

    edges = to_hz(np.linspace(to_mel(fmin_hz), to_mel(fmax_hz), n_mels + 2))
    freqs = np.linspace(0.0, sample_rate_hz / 2, n_fft // 2 + 1)
    lower, center, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None, :] - lower) / (center - lower)
    falling = (upper - freqs[None, :]) / (upper - center)
    return np.maximum(0.0, np.minimum(rising, falling))


@contextlib.contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class DemoAudio:
    """The utterances of several DTMF corpus folders, in the given order; ``utt_id`` is
    ``<set name>-<utterance>`` (the demo sets reuse utterance names)."""

    def __init__(self, data: Sequence[dict]):
        self.entries = [(f"{d['name']}-{utt}", path) for d in data for utt, path, _ in read_corpus(Path(d["data_dir"]))]

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        utt_id, path = self.entries[idx]
        speech, _ = read_wav(path)
        return {"utt_id": utt_id, "speech": speech}


class FeatsProvider(EnvironmentProvider):
    """``config``: ``{"data": [{name, data_dir}, ...], "features": {LogMel arguments}}`` (plain values).

    The env: ``dataset`` (:class:`DemoAudio`) and ``extractor`` (:class:`LogMel`). The default
    ``build_worker_setup_fn`` ships this provider (its small config) to each worker once.
    """

    def build_env_local(self) -> dict[str, Any]:
        return {
            "dataset": self.build_dataset(self.config),
            "extractor": LogMel(**dict(self.config.get("features") or {})),
        }

    @staticmethod
    def build_dataset(config: dict) -> DemoAudio:
        return DemoAudio(config["data"])


class FeatsRunner(BaseRunner):
    """Log-mel features per utterance into ``split.N/feats/``, partial sums per shard, merged statistics."""

    @staticmethod
    def forward(idx, dataset=None, extractor=None, **env):
        items = idx if isinstance(idx, list) else [idx]
        out = []
        for i in items:
            item = dataset[i]
            out.append({"utt_id": item["utt_id"], "feats": extractor(item["speech"])})
        return out if isinstance(idx, list) else out[0]

    @staticmethod
    def open_writers(shard_dir, **env):
        (Path(shard_dir) / "feats").mkdir(parents=True, exist_ok=True)
        return {
            "scp": open(Path(shard_dir) / "feats.scp", "w", encoding="utf-8"),
            "shape": open(Path(shard_dir) / "feats_shape", "w", encoding="utf-8"),
        }

    @staticmethod
    def write_record(writers, result, state, **env):
        for record in result if isinstance(result, list) else [result]:
            feats = record["feats"]
            path = Path(os.path.abspath(state["shard_dir"])) / "feats" / f"{record['utt_id']}.npy"
            np.save(path, feats)
            writers["scp"].write(f"{record['utt_id']} {path}\n")
            writers["shape"].write(f"{record['utt_id']} {feats.shape[0]},{feats.shape[1]}\n")
            x = feats.astype(np.float64)
            state["count"] = state.get("count", 0) + int(x.shape[0])
            state["sum"] = state.get("sum", 0.0) + x.sum(axis=0)
            state["sum_square"] = state.get("sum_square", 0.0) + (x * x).sum(axis=0)

    @staticmethod
    def close_writers(writers, state, extractor=None, **env):
        for writer in writers.values():
            writer.close()
        dims = extractor.n_mels if extractor is not None else 0
        partial = {
            "count": state.get("count", 0),
            "sum": np.broadcast_to(state.get("sum", 0.0), (dims,)).tolist(),
            "sum_square": np.broadcast_to(state.get("sum_square", 0.0), (dims,)).tolist(),
        }
        (Path(state["shard_dir"]) / "stats_partial.json").write_text(json.dumps(partial) + "\n", encoding="utf-8")
        return None

    def merge(self, shard_dirs) -> dict[str, Any]:
        """Merged ``feats.scp`` / ``feats_shape`` and the global statistics; returns them (and the paths)."""
        out = Path(self.output_dir)
        concat_files([Path(d) / "feats.scp" for d in shard_dirs], out / "feats.scp")
        concat_files([Path(d) / "feats_shape" for d in shard_dirs], out / "feats_shape")
        count, total, total_sq = 0, None, None
        for d in shard_dirs:  # shard order: the additions happen in the same order on every backend
            partial = json.loads((Path(d) / "stats_partial.json").read_text(encoding="utf-8"))
            count += int(partial["count"])
            add, add_sq = np.asarray(partial["sum"], np.float64), np.asarray(partial["sum_square"], np.float64)
            total = add if total is None else total + add
            total_sq = add_sq if total_sq is None else total_sq + add_sq
        mean = total / max(count, 1)
        var = np.maximum(total_sq / max(count, 1) - mean * mean, 0.0)
        std = np.sqrt(var)
        write_npz(
            out / "feats_stats.npz", {"count": np.array(count, dtype=np.int64), "sum": total, "sum_square": total_sq}
        )
        atomic_write_text(
            out / "stats.json",
            json.dumps({"count": count, "mean": mean.tolist(), "var": var.tolist(), "std": std.tolist()}, indent=1)
            + "\n",
        )
        n_utts = sum(1 for d in shard_dirs for _ in open(Path(d) / "feats.scp", encoding="utf-8"))
        return {
            "utterances": n_utts,
            "frames": count,
            "mean": mean,
            "std": std,
            "feats_scp": str(out / "feats.scp"),
            "stats": str(out / "feats_stats.npz"),
        }


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """``np.savez`` with fixed zip timestamps (numpy stamps the current time), written atomically, so
    the same arrays always give the same bytes; ``np.load`` reads it as usual."""
    with atomic_open(Path(path), "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())
    return Path(path)


def mean_std_line(result: dict, dims: int = 3) -> str:
    """``mean[:3] = ... std[:3] = ...`` for the terminal."""
    fmt = ", ".join
    return (
        f"mean[:{dims}] = [{fmt(f'{v:.4f}' for v in result['mean'][:dims])}]  "
        f"std[:{dims}] = [{fmt(f'{v:.4f}' for v in result['std'][:dims])}]"
    )
