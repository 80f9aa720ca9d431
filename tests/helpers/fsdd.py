"""Real audio for tests: the FSDD spoken-digit recordings and a torch feature model over them."""

from __future__ import annotations

from pathlib import Path

from dtmf_demo.dtmf import read_wav


class FsddDataset:
    def __init__(self, root: str, limit: int | None = None):
        self.paths = sorted(Path(root).glob("*.wav"))[:limit]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int) -> dict:
        path = self.paths[idx]
        speech, rate = read_wav(path)
        return {"utt_id": path.stem, "speech": speech, "text": path.stem.split("_")[0]}


class FsddOrganizer:
    def __init__(self, test=()):
        self.test = {t["name"]: FsddDataset(t["root"], t.get("limit")) for t in test}


class LogEnergyModel:
    """A torch model: 25 ms / 10 ms STFT frames -> frame count and mean log energy, per item."""

    def __init__(self, device: str = "cpu"):
        import torch

        self.torch = torch
        self.window = torch.hann_window(200)

    def features(self, speech) -> tuple[int, float]:
        torch = self.torch
        spec = torch.stft(
            torch.from_numpy(speech), n_fft=256, hop_length=80, win_length=200, window=self.window, return_complex=True
        )
        energy = spec.abs().pow(2).sum(dim=0).clamp_min(1e-10).log()
        return int(energy.shape[0]), float(energy.mean())

    def __call__(self, speech):
        if isinstance(speech, list):  # items one by one: identical numbers with or without batching
            return [self.features(s) for s in speech]
        return self.features(speech)


def fsdd_output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [fsdd_output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    frames, energy = model_output
    return {"utt_id": data["utt_id"], "frames": frames, "log_energy": f"{energy:.4f}", "digit": data["text"]}


def fsdd_inference_config(inference_dir, root, *, limit: int, num_shards: int) -> dict:
    """An inference config decoding ``limit`` FSDD recordings under ``root`` with :class:`LogEnergyModel`
    through ESPnet3's provider and runner, batches of 4, 2 local workers, ``num_shards`` shards."""
    return {
        "inference_dir": str(inference_dir),
        "dataset": {
            "_target_": "tests.helpers.fsdd.FsddOrganizer",
            "test": [{"name": "fsdd", "root": str(root), "limit": limit}],
        },
        "model": {"_target_": "tests.helpers.fsdd.LogEnergyModel"},
        "input_key": "speech",
        "output_fn": "tests.helpers.fsdd.fsdd_output_fn",
        "batch_size": 4,
        "provider": {"_target_": "espnet3.systems.base.inference_provider.InferenceProvider"},
        "runner": {"_target_": "espnet3.systems.base.inference_runner.InferenceRunner"},
        "parallel": {"env": "local", "n_workers": 2, "num_shards": num_shards},
    }
