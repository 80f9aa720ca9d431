"""Case (d): outputs that are not scalars become artifact files; the SCP line holds the path.

Per item: ``feats`` (ndarray -> ``.npy``), ``wave`` (1-D tensor -> ``.wav`` at 8 kHz, as
``output_artifacts`` says), ``info`` (dict -> ``.json``), ``summary`` (a custom object ->
``.pkl``), ``spectrum`` (ndarray with no ``output_artifacts`` entry: ``.npy`` by default), and
the scalars ``score`` (numpy float64), ``frames`` (0-d tensor) and ``correct`` (bool), written
in the line itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class Summary:
    """A custom object: pickled."""

    utt_id: str
    hyp: str
    n_samples: int


def output_fn(data: Any, model_output: Any, idx: Any) -> Any:
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    speech = np.asarray(data["speech"], dtype=np.float32)
    frames = speech[: (speech.shape[0] // 80) * 80].reshape(-1, 80)
    energy = np.log(np.maximum((frames.astype(np.float64) ** 2).mean(axis=1), 1e-10))
    return {
        "utt_id": data["utt_id"],
        "hyp": model_output,
        "feats": energy.astype(np.float32),
        "wave": torch.from_numpy(speech[:800].copy()),
        "info": {"hyp": model_output, "ref": data["text"], "digits": [int(c) for c in data["text"]]},
        "summary": Summary(data["utt_id"], model_output, int(speech.shape[0])),
        "spectrum": np.abs(np.fft.rfft(speech[:256].astype(np.float64))).round(4),
        "score": np.float64(round(float(energy.mean()), 4)),
        "frames": torch.tensor(int(frames.shape[0])),
        "correct": model_output == data["text"],
    }
