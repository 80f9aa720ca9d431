"""Audio values for the inference contract: ESPnet3 202611's ``Audio`` without espnet3.

:class:`Audio` (a float32 waveform and its rate), :func:`is_audio` (ours or ESPnet3's), and the
shims that hand our ``Audio`` to ESPnet3 as its own class where :mod:`espnet3_prefect.espnet3.contract`
delegates to ``espnet3.contract``. Moved out of ``contract.py``; ``espnet3_prefect.espnet3.contract``
re-exports :class:`Audio` and :func:`is_audio`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ESPNET3_VERSION = "202611"
INSTALL_ESPNET3 = f"pip install espnet=={ESPNET3_VERSION}"


def _upstream_audio_class():
    """ESPnet3's ``Audio`` if its module is already loaded (never imports it)."""
    module = sys.modules.get("espnet3.contract.kinds.audio")
    return getattr(module, "Audio", None)


def is_audio(value: Any) -> bool:
    """Tell whether ``value`` is an :class:`Audio`, ours or ESPnet3's.

    Examples:
        >>> is_audio(Audio(np.zeros(4, dtype=np.float32), 8000)), is_audio(np.zeros(4))
        (True, False)
    """
    if isinstance(value, Audio):
        return True
    upstream = _upstream_audio_class()
    return upstream is not None and isinstance(value, upstream)


def _to_float32_samples(samples: Any) -> np.ndarray:
    """Samples as float32: integer PCM scaled to [-1, 1) by its midpoint, floats kept."""
    samples = np.asarray(samples)
    dtype = samples.dtype
    if np.issubdtype(dtype, np.unsignedinteger):
        # unsigned PCM (8-bit WAV) is centred on its midpoint, not on zero
        centre = (np.iinfo(dtype).max + 1) / 2
        samples = (samples.astype(np.float64) - centre) / centre
    elif np.issubdtype(dtype, np.integer):
        # signed PCM: the most negative value maps to -1 (int16 divides by 32768)
        samples = samples / float(-np.iinfo(dtype).min)
    elif not np.issubdtype(dtype, np.floating):
        raise TypeError(f"audio samples must be integer or floating point numbers, got dtype {dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        return samples.astype(np.float32, copy=False)


@dataclass(frozen=True, eq=False)
class Audio:
    """A float32 waveform and its sample rate: ESPnet3's ``Audio`` without espnet3.

    ``array`` is 1-D for mono and ``(channels, samples)`` otherwise. A 2-D input is laid out with
    the shorter axis as channels (``(samples, channels)`` from soundfile is transposed), except
    that a one- or two-frame array keeps its layout; one channel becomes 1-D. Integer PCM is
    scaled by its midpoint (int16 / 32768, uint8 centred on 128); floats are kept as they are.

    Raises:
        TypeError: the samples are not integers or floats.
        ValueError: a sample is NaN or infinite, the array is not 1-D or 2-D, or ``rate <= 0``.

    Examples:
        >>> stereo = Audio(np.array([[0, 16384], [-32768, 0], [0, 0]], dtype=np.int16), 8000)
        >>> stereo.array
        array([[ 0. , -1. ,  0. ],
               [ 0.5,  0. ,  0. ]], dtype=float32)
        >>> stereo.channels, stereo.rate, stereo.mono().array
        (2, 8000, array([ 0., -1.,  0.], dtype=float32))
    """

    array: np.ndarray
    rate: int

    def __post_init__(self) -> None:
        samples = _to_float32_samples(self.array)
        if not np.isfinite(samples).all():
            raise ValueError("audio samples must be finite, found NaN or Inf")
        if samples.ndim == 2:
            frames_first = samples.shape[0] > samples.shape[1] and samples.shape[0] > 2
            if frames_first:
                samples = samples.T
            if samples.shape[0] == 1:
                samples = samples[0]
        if samples.ndim not in (1, 2):
            raise ValueError(f"audio must be 1-D (mono) or 2-D (channels, samples), got shape {samples.shape}")
        object.__setattr__(self, "array", np.ascontiguousarray(samples))
        object.__setattr__(self, "rate", int(self.rate))
        if self.rate <= 0:
            raise ValueError(f"audio sample rate must be positive, got {self.rate}")

    @property
    def channels(self) -> int:
        """The number of channels (1 for a 1-D array)."""
        return 1 if self.array.ndim == 1 else self.array.shape[0]

    @property
    def duration(self) -> float:
        """Seconds of audio.

        Examples:
            >>> Audio(np.zeros(4000, dtype=np.float32), 8000).duration
            0.5
        """
        return self.array.shape[-1] / self.rate

    def mono(self, channel: int = 0) -> Audio:
        """One channel (the first by default) as 1-D audio; ``self`` when already mono."""
        if self.array.ndim == 1:
            return self
        return Audio(self.array[channel], self.rate)

    def multichannel(self) -> Audio:
        """This audio as ``(channels, samples)``: mono becomes ``(1, samples)``."""
        if self.array.ndim == 2:
            return self
        out = Audio.__new__(Audio)
        object.__setattr__(out, "array", self.array[None, :])
        object.__setattr__(out, "rate", self.rate)
        return out

    @classmethod
    def read(cls, path: str | Path, rate: int | None = None) -> Audio:
        """Read an audio file with soundfile (every channel), resampled to ``rate`` when given."""
        try:
            import soundfile
        except ImportError:
            raise ModuleNotFoundError(
                f"reading audio file {str(path)!r} needs soundfile: pip install soundfile", name="soundfile"
            ) from None
        samples, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        audio = cls(samples, file_rate)
        return audio if rate is None else audio.resample(rate)

    def resample(self, rate: int) -> Audio:
        """This audio at ``rate`` (librosa's default resampler, as ESPnet3); ``self`` if already there."""
        if rate == self.rate:
            return self
        try:
            import librosa
        except ImportError:
            raise ModuleNotFoundError(
                f"audio at {self.rate} Hz must be resampled to {rate} Hz, which needs librosa: "
                f"pip install librosa (or {INSTALL_ESPNET3}, which brings it), or give audio at {rate} Hz",
                name="librosa",
            ) from None
        return Audio(librosa.resample(self.array, orig_sr=self.rate, target_sr=rate, axis=-1), rate)

    @classmethod
    def coerce(cls, value: Any, rate: int | None) -> Audio:
        """Make an :class:`Audio` at ``rate`` (``None``: its own rate) from what a caller holds.

        Accepted: an ``Audio`` (ours or ESPnet3's), a file path (read with soundfile), a
        ``(rate, samples)`` pair, or a bare NumPy array / torch tensor taken to be at ``rate``
        (refused when ``rate`` is None: a bare array carries no rate).

        Examples:
            >>> Audio.coerce((8000, np.zeros(3, dtype=np.int16)), 8000).array
            array([0., 0., 0.], dtype=float32)
            >>> Audio.coerce(np.zeros(3), None)  # doctest: +NORMALIZE_WHITESPACE
            Traceback (most recent call last):
            TypeError: cannot tell the sample rate of a bare audio array: set the field's sample_rate (or
            model.sample_rate), or pass an Audio, a (rate, samples) pair or a file path
        """
        if not isinstance(value, Audio) and is_audio(value):
            value = Audio(value.array, value.rate)  # ESPnet3's Audio: same samples, our class
        if isinstance(value, Audio):
            # frozen, but its buffer may have been written to since construction
            if not np.isfinite(value.array).all():
                raise ValueError("audio samples must be finite, found NaN or Inf")
            return value if rate is None else value.resample(rate)
        if isinstance(value, (str, Path)):
            return cls.read(value, rate)
        if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (int, np.integer)):
            audio = cls(np.asarray(value[1]), int(value[0]))
            return audio if rate is None else audio.resample(rate)
        if hasattr(value, "detach"):  # a torch tensor (torch is never imported here)
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            if rate is None:
                raise TypeError(
                    "cannot tell the sample rate of a bare audio array: set the field's sample_rate "
                    "(or model.sample_rate), or pass an Audio, a (rate, samples) pair or a file path"
                )
            return cls(value, rate)
        raise TypeError(
            "audio must be an Audio, a file path, a (rate, samples) pair, a NumPy array or a "
            f"tensor, got {type(value).__name__}"
        )


def upstream_audio(value: Any) -> Any:
    """Our Audio as ESPnet3's (same float32 samples), so ESPnet3's kinds accept it."""
    if isinstance(value, Audio):
        return _upstream_audio_class()(value.array, value.rate)
    return value


def shim_mapping(value: Any) -> Any:
    """A mapping whose values (or lists of values) of our Audio become ESPnet3's; else as is."""
    if not isinstance(value, Mapping):
        return value

    def has_ours(v):
        return isinstance(v, Audio) or (isinstance(v, (list, tuple)) and any(isinstance(x, Audio) for x in v))

    if not any(has_ours(v) for v in value.values()):
        return value
    out = {}
    for key, v in value.items():
        if isinstance(v, (list, tuple)):
            v = type(v)(upstream_audio(x) for x in v)
        out[key] = upstream_audio(v)
    return out


class AudioShimDataset:
    """Reads items from a dataset, handing ESPnet3 its own Audio class."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, index):
        return shim_mapping(self.dataset[index])
