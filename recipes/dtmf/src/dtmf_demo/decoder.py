"""The demo's recognizer: :class:`DTMFDecoder`, a small fixed-weight torch model (windowed DFT
filter bank at the 7 DTMF frequencies, per-frame classification, CTC-style run collapsing) that
turns DTMF audio back into the digit string.

>>> from dtmf_demo.dtmf import synthesize
>>> DTMFDecoder().decode(synthesize("2024", seed=0))
'2024'
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dtmf_demo.dtmf import DTMF_FREQS_HZ, HIGH_FREQS_HZ, KEYS, LOW_FREQS_HZ


def collate(waves: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-pad 1-D waveforms into a float32 ``[B, T]`` batch + int64 lengths.

    >>> x, n = collate([np.ones(3), np.ones(5)])
    >>> tuple(x.shape), n.tolist()
    ((2, 5), [3, 5])
    """
    lengths = torch.tensor([int(np.asarray(w).shape[0]) for w in waves], dtype=torch.long)
    batch = torch.zeros(len(waves), int(lengths.max()) if len(waves) else 0)
    for i, w in enumerate(waves):
        batch[i, : lengths[i]] = torch.from_numpy(np.asarray(w, dtype=np.float32).reshape(-1))
    return batch, lengths


def collapse(labels: list[int], *, blank: int = -1, min_run: int = 2) -> list[int]:
    """CTC-style collapse: drop key runs shorter than ``min_run``, merge repeats, drop blanks.

    A blank run of any length separates two equal keys ("77").

    >>> collapse([-1, 7, 7, 7, -1, 7, 7, 3, 7, 7, -1, 5])
    [7, 7]
    """
    runs: list[list[int]] = []
    for lab in labels:
        if runs and runs[-1][0] == lab:
            runs[-1][1] += 1
        else:
            runs.append([lab, 1])
    kept = [lab for lab, n in runs if lab == blank or n >= min_run]
    merged = [lab for i, lab in enumerate(kept) if i == 0 or lab != kept[i - 1]]
    return [lab for lab in merged if lab != blank]


class DTMFDecoder(torch.nn.Module):
    """Fixed-weight torch DTMF recognizer: audio ``[B, T]`` -> digit strings.

    Pipeline: Hann-windowed frames (``frame_s``/``hop_s``) -> DFT filter bank
    at the 7 DTMF frequencies as a strided ``conv1d`` with cos/sin kernels ->
    per-tone amplitudes -> per-frame key (argmax of low and high group) if both
    amplitudes exceed ``min_tone_db`` dBFS, the two tones carry at least
    ``min_tone_ratio`` of the frame power and the twist is <= ``max_twist_db``;
    otherwise blank -> :func:`collapse` with ``min_run`` frames.  Frames that
    reach beyond an item's length are blank, so padding never creates keys.

    >>> from dtmf_demo.dtmf import synthesize
    >>> dec = DTMFDecoder()
    >>> dec(*collate([synthesize("77", seed=0), synthesize("123", seed=1)]))
    ['77', '123']
    """

    def __init__(
        self,
        sample_rate_hz: int = 8000,
        *,
        frame_s: float = 0.02,
        hop_s: float = 0.01,
        min_tone_db: float = -30.0,
        min_tone_ratio: float = 0.6,
        max_twist_db: float = 10.0,
        min_run: int = 2,
    ) -> None:
        super().__init__()
        if sample_rate_hz <= 2 * max(HIGH_FREQS_HZ):
            raise ValueError(f"sample_rate_hz={sample_rate_hz} too low for DTMF tones")
        self.sample_rate_hz = int(sample_rate_hz)
        self.frame_len = int(round(frame_s * sample_rate_hz))
        self.hop_len = int(round(hop_s * sample_rate_hz))
        self.min_amplitude = 10.0 ** (min_tone_db / 20.0)
        self.min_tone_ratio = float(min_tone_ratio)
        self.max_twist = 10.0 ** (max_twist_db / 20.0)
        self.min_run = int(min_run)
        kernels, window = self._filter_bank()
        # the filter bank is the model's one weight tensor: ``state_dict()`` holds it, so a checkpoint
        # (``torch.save(decoder.state_dict(), path)``) can carry a differently tuned bank
        self.register_buffer("kernels", kernels)
        self.register_buffer("window", window, persistent=False)
        self.register_buffer("key_table", self._key_table(), persistent=False)

    def _filter_bank(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Build ``[14, 1, N]`` cos/sin kernels (scaled to tone amplitude) + window."""
        n = torch.arange(self.frame_len, dtype=torch.float64)
        window = torch.hann_window(self.frame_len, periodic=False, dtype=torch.float64)
        freqs = torch.tensor(LOW_FREQS_HZ + HIGH_FREQS_HZ, dtype=torch.float64)
        omega_n = 2 * math.pi * freqs[:, None] * n[None, :] / self.sample_rate_hz
        scale = 2.0 / window.sum()  # |X| * 2 / sum(w) ~= sinusoid amplitude
        kernels = torch.cat([torch.cos(omega_n), torch.sin(omega_n)]) * window * scale
        return kernels.float()[:, None, :], (window / window.sum()).float()[None, None, :]

    @staticmethod
    def _key_table() -> torch.Tensor:
        """``[4, 3]`` index into :data:`KEYS` for each (low, high) pair, -1 if unused."""
        table = torch.full((len(LOW_FREQS_HZ), len(HIGH_FREQS_HZ)), -1, dtype=torch.long)
        for key, (low, high) in DTMF_FREQS_HZ.items():
            table[LOW_FREQS_HZ.index(low), HIGH_FREQS_HZ.index(high)] = KEYS.index(key)
        return table

    def frame_labels(self, wave: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Per-frame labels ``[B, F]``: index into :data:`KEYS`, or -1 for blank.

        >>> DTMFDecoder().frame_labels(torch.zeros(1, 400), torch.tensor([400])).shape
        torch.Size([1, 4])
        """
        x = wave.to(self.kernels.dtype)[:, None, :]
        if x.shape[-1] < self.frame_len:
            return torch.full((x.shape[0], 0), -1, dtype=torch.long, device=x.device)
        spec = torch.nn.functional.conv1d(x, self.kernels, stride=self.hop_len)
        n_low, n_tones = len(LOW_FREQS_HZ), len(LOW_FREQS_HZ) + len(HIGH_FREQS_HZ)
        amp = torch.sqrt(spec[:, :n_tones] ** 2 + spec[:, n_tones:] ** 2)  # [B, 7, F]
        power = torch.nn.functional.conv1d(x * x, self.window, stride=self.hop_len)[:, 0]
        low, low_idx = amp[:, :n_low].max(dim=1)
        high, high_idx = amp[:, n_low:].max(dim=1)
        tone_power = (low * low + high * high) / 2.0
        is_key = (
            (torch.minimum(low, high) >= self.min_amplitude)
            & (tone_power >= self.min_tone_ratio * power)
            & (torch.maximum(low, high) <= self.max_twist * torch.minimum(low, high))
        )
        frame_end = torch.arange(spec.shape[-1], device=x.device) * self.hop_len + self.frame_len
        is_key &= frame_end[None, :] <= lengths.to(x.device)[:, None]
        labels = self.key_table[low_idx, high_idx]
        return torch.where(is_key, labels, torch.full_like(labels, -1))

    @torch.no_grad()
    def forward(self, wave: torch.Tensor, lengths: torch.Tensor) -> list[str]:
        """Decode a zero-padded batch ``[B, T]`` with valid ``lengths`` ``[B]``.

        >>> from dtmf_demo.dtmf import synthesize
        >>> DTMFDecoder()(*collate([synthesize("909", seed=3)]))
        ['909']
        """
        if wave.dim() != 2 or lengths.shape != (wave.shape[0],):
            raise ValueError(f"expected wave [B, T] and lengths [B], got {tuple(wave.shape)}, {tuple(lengths.shape)}")
        labels = self.frame_labels(wave, lengths).cpu().tolist()
        return ["".join(KEYS[k] for k in collapse(row, min_run=self.min_run)) for row in labels]

    def decode(self, wave_np: np.ndarray) -> str:
        """Decode one 1-D waveform sampled at ``sample_rate_hz``.

        >>> from dtmf_demo.dtmf import synthesize
        >>> DTMFDecoder().decode(synthesize("31337", seed=7))
        '31337'
        """
        batch, lengths = collate([wave_np])
        return self(batch.to(self.kernels.device), lengths)[0]
