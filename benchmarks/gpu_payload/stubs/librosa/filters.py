"""A mel filter bank as ``librosa.filters.mel`` defines it (Slaney's mel scale and area
normalisation by default, or the HTK formula), written from the formulas for the GPU payload;
checked equal to librosa's on the CPU (see benchmarks/throughput.py's GPU notes)."""

import numpy as np


def hz_to_mel(hz, htk=False):
    hz = np.asanyarray(hz, dtype=np.float64)
    if htk:
        return 2595.0 * np.log10(1.0 + hz / 700.0)
    linear_step = 200.0 / 3  # Hz per mel below 1 kHz
    log_start_hz, log_start_mel = 1000.0, 1000.0 / linear_step
    log_step = np.log(6.4) / 27.0
    mel = hz / linear_step
    above = hz >= log_start_hz
    return np.where(above, log_start_mel + np.log(np.maximum(hz, 1e-10) / log_start_hz) / log_step, mel)


def mel_to_hz(mel, htk=False):
    mel = np.asanyarray(mel, dtype=np.float64)
    if htk:
        return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)
    linear_step = 200.0 / 3
    log_start_hz, log_start_mel = 1000.0, 1000.0 / linear_step
    log_step = np.log(6.4) / 27.0
    hz = mel * linear_step
    return np.where(mel >= log_start_mel, log_start_hz * np.exp(log_step * (mel - log_start_mel)), hz)


def mel(*, sr, n_fft, n_mels=128, fmin=0.0, fmax=None, htk=False, norm="slaney", dtype=np.float32):
    if norm not in ("slaney", None):
        raise NotImplementedError(f"librosa.filters.mel(norm={norm!r}): the stub has slaney and None")
    fmax = sr / 2.0 if fmax is None else fmax
    bins_hz = np.fft.rfftfreq(n_fft, 1.0 / sr)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin, htk), hz_to_mel(fmax, htk), n_mels + 2), htk)
    widths = np.diff(edges)
    ramps = edges[:, None] - bins_hz[None, :]
    weights = np.zeros((n_mels, len(bins_hz)))
    for m in range(n_mels):
        rising = -ramps[m] / widths[m]
        falling = ramps[m + 2] / widths[m + 1]
        weights[m] = np.maximum(0.0, np.minimum(rising, falling))
    if norm == "slaney":
        weights *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, None]
    return weights.astype(dtype)
