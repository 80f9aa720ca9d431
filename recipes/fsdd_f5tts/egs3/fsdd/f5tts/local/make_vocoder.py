"""A Vocos vocoder for this recipe, initialised here (seeded) and saved where ``vocoder_path`` points.

F5-TTS vocodes its mel with Vocos; without ``vocoder_path`` ESPnet3 downloads the 24 kHz checkpoint
from the Hugging Face Hub. This recipe works offline: the same Vocos classes, sized for FSDD's 8 kHz
audio and this recipe's mel (``model.feats_extract_config`` in conf/training.yaml), with weights
drawn from a fixed seed, written as the folder ``Vocos.from_hparams`` + ``load_state_dict`` read::

    python local/make_vocoder.py exp/vocoder      # config.yaml + pytorch_model.bin

Untrained, it makes noise shaped by the mel: enough to run and compare every stage, not to listen to.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

SAMPLE_RATE = 8000
N_FFT = 256
HOP_LENGTH = 64
N_MELS = 32
SEED = 0

CONFIG = {
    "feature_extractor": {
        "class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
        "init_args": {"sample_rate": SAMPLE_RATE, "n_fft": N_FFT, "hop_length": HOP_LENGTH, "n_mels": N_MELS},
    },
    "backbone": {
        "class_path": "vocos.models.VocosBackbone",
        "init_args": {"input_channels": N_MELS, "dim": 64, "intermediate_dim": 128, "num_layers": 2},
    },
    "head": {
        "class_path": "vocos.heads.ISTFTHead",
        "init_args": {"dim": 64, "n_fft": N_FFT, "hop_length": HOP_LENGTH, "padding": "center"},
    },
}


def make_vocoder(folder: Path) -> Path:
    """Write ``config.yaml`` and ``pytorch_model.bin`` of a seeded Vocos into ``folder``; returns it."""
    from vocos import Vocos

    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    torch.manual_seed(SEED)
    vocoder = Vocos.from_hparams(str(config))
    torch.save(vocoder.state_dict(), folder / "pytorch_model.bin")
    return folder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write config.yaml and pytorch_model.bin")
    print(make_vocoder(parser.parse_args().folder))
