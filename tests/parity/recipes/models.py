"""Small real torch models for the parity recipes (fixed weights: same numbers in every process)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dtmf_demo.recipe import DTMFRecognizer

from .data import DIGIT_WORDS


def single_thread() -> None:
    """One intra-op thread, so every process computes the same float bits (an in-process Dask
    worker would otherwise use all cores while a spawned one is limited to one)."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


class DTMFModel(DTMFRecognizer):
    """The demo's DTMF recognizer (a fixed-weight torch filter bank), single-threaded."""

    def __init__(self, sample_rate_hz: int = 8000, device: str = "cpu"):
        single_thread()
        super().__init__(sample_rate_hz, device)


def as_array(speech: Any) -> np.ndarray:
    """A waveform from what a model may be handed: an array, a tensor, or ESPnet3's ``Audio``."""
    if hasattr(speech, "array") and hasattr(speech, "rate"):
        speech = speech.array
    if isinstance(speech, torch.Tensor):
        speech = speech.detach().cpu().numpy()
    return np.asarray(speech, dtype=np.float32)


class DigitNet:
    """Log-power spectrogram (``torch.stft``) averaged over time -> fixed random linear layer ->
    10 digit scores. Float64 throughout, and one item at a time even inside a batch, so the
    numbers never depend on how items were batched."""

    def __init__(self, seed: int = 0, n_fft: int = 256, device: str = "cpu"):
        single_thread()
        generator = torch.Generator().manual_seed(int(seed))
        self.n_fft = int(n_fft)
        self.weight = torch.randn(self.n_fft // 2 + 1, len(DIGIT_WORDS), generator=generator, dtype=torch.float64)
        self.window = torch.hann_window(self.n_fft, dtype=torch.float64)
        self.device = device
        self.offset = 0  # custom_provider's build_model shifts the predicted digit

    def features(self, speech: Any) -> torch.Tensor:
        """``[frames, n_fft/2+1]`` log power."""
        wave = torch.from_numpy(as_array(speech).astype(np.float64))
        if wave.shape[0] < self.n_fft:
            wave = torch.nn.functional.pad(wave, (0, self.n_fft - wave.shape[0]))
        spec = torch.stft(wave, n_fft=self.n_fft, hop_length=self.n_fft // 2, window=self.window, return_complex=True)
        return spec.abs().pow(2).clamp_min(1e-10).log().T

    def scores(self, speech: Any) -> torch.Tensor:
        return self.features(speech).mean(dim=0) @ self.weight

    def nbest(self, speech: Any, n: int = 2) -> list[tuple[str, float]]:
        top = torch.topk(self.scores(speech), n)
        return [(DIGIT_WORDS[(int(i) + self.offset) % 10], round(float(s), 3)) for s, i in zip(top.values, top.indices)]

    def word(self, speech: Any) -> str:
        return self.nbest(speech, 1)[0][0]

    def __call__(self, speech: Any) -> Any:
        if isinstance(speech, list):
            return [self.word(s) for s in speech]
        return self.word(speech)

    def eval(self) -> DigitNet:
        return self
