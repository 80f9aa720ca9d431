"""Synthetic DTMF "speech recognition" demo: data generator + real torch decoder.

Utterances are sequences of keypad digits rendered as dual-tone (DTMF) bursts
separated by silences, plus white noise; some utterances can carry one
impairment (a weak tone, two presses merged, crosstalk, a stray key) that a
correct decoder mishears in a known way.  :class:`DTMFDecoder` is a small,
fixed-weight torch model (windowed DFT filter bank at the 7 DTMF frequencies,
per-frame classification, CTC-style run collapsing) that turns audio back into
the digit string, so inference outputs can be scored against references
without downloading anything.

>>> import numpy as np
>>> DTMFDecoder().decode(synthesize("2024", seed=0))
'2024'
"""

from __future__ import annotations

import io
import math
import os
import wave
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_open

KEYS = "0123456789"
"""Symbols the demo uses (digits only; ``*``/``#``/``A-D`` are not generated)."""

LOW_FREQS_HZ = (697.0, 770.0, 852.0, 941.0)
HIGH_FREQS_HZ = (1209.0, 1336.0, 1477.0)

# Standard keypad layout: rows = low group, columns = high group.
_KEYPAD = ("123", "456", "789", "*0#")

DTMF_FREQS_HZ: dict[str, tuple[float, float]] = {
    key: (LOW_FREQS_HZ[row], HIGH_FREQS_HZ[col])
    for row, keys in enumerate(_KEYPAD)
    for col, key in enumerate(keys)
    if key in KEYS
}
"""``digit -> (low_hz, high_hz)`` for every symbol in :data:`KEYS`."""


# --------------------------------------------------------------------------
# Synthesis
# --------------------------------------------------------------------------
def _tone(
    key: str, n: int, amplitude: float, sample_rate_hz: int, rng: np.random.Generator,
    high_gain: float = 1.0,
) -> np.ndarray:
    """Return ``n`` samples of the dual tone for ``key`` with random phases."""
    t = np.arange(n, dtype=np.float64) / sample_rate_hz
    low, high = DTMF_FREQS_HZ[key]
    phase = rng.uniform(0.0, 2.0 * math.pi, size=2)
    half = amplitude / 2.0
    low_wave = np.sin(2 * math.pi * low * t + phase[0])
    return half * (low_wave + high_gain * np.sin(2 * math.pi * high * t + phase[1]))


IMPAIRMENTS = ("weak_high", "merged", "crosstalk", "talk_off")
"""What can go wrong with one tone of an utterance (the middle one, ``len(digits) // 2``):

- ``weak_high``: its high-group tone arrives 20 dB down (line loss) -> the key is not heard (deletion);
- ``merged``: it repeats the previous key with no gap in between, as one long press -> one key (deletion);
- ``crosstalk``: a sinusoid at the neighbouring row's frequency, twice as loud as the key's own low
  tone, overlaps it -> the neighbouring row's key (substitution);
- ``talk_off``: a stray key burst sounds in the gap after it -> an extra key (insertion).
"""


def _neighbour_row_key(key: str) -> str:
    """The key in the same column one row up (down from the top row); always a digit."""
    row = next(r for r, keys in enumerate(_KEYPAD) if key in keys)
    other = row - 1 if row > 0 else row + 1
    return _KEYPAD[other][_KEYPAD[row].index(key)]


def _stray_key(digits: str, at: int) -> str:
    """The key a ``talk_off`` burst after ``digits[at]`` plays: unlike both of its neighbours."""
    near = {digits[at], digits[at + 1] if at + 1 < len(digits) else ""}
    return next(k for k in KEYS if k not in near)


def heard(digits: str, impairment: str | None = None) -> str:
    """What a correct decoder hears for ``digits`` rendered with ``impairment`` (see :data:`IMPAIRMENTS`).

    >>> [heard("3771", kind) for kind in IMPAIRMENTS]
    ['371', '371', '3171', '37171']
    """
    if impairment is None:
        return digits
    at = _impaired_index(digits, impairment)
    if impairment in ("weak_high", "merged"):
        return digits[:at] + digits[at + 1:]
    if impairment == "crosstalk":
        return digits[:at] + _neighbour_row_key(digits[at]) + digits[at + 1:]
    return digits[: at + 1] + _stray_key(digits, at) + digits[at + 1:]


def _impaired_index(digits: str, impairment: str) -> int:
    if impairment not in IMPAIRMENTS:
        raise ValueError(f"unknown impairment {impairment!r}; valid: {', '.join(IMPAIRMENTS)}")
    at = len(digits) // 2
    if len(digits) < 2 or (impairment == "merged" and digits[at] != digits[at - 1]):
        raise ValueError(f"impairment {impairment!r} needs 2+ digits (merged: a repeated middle key), got {digits!r}")
    return at


def synthesize(
    digits: str,
    *,
    sample_rate_hz: int = 8000,
    tone_s: float = 0.08,
    gap_s: float = 0.04,
    noise_db: float = -30.0,
    seed: int,
    impairment: str | None = None,
) -> np.ndarray:
    """Render ``digits`` as DTMF tones separated by silences, plus white noise.

    Each tone lasts ``tone_s`` and each gap ``gap_s`` (both jittered by +-20 %),
    the peak amplitude is ~0.5 (jittered by +-20 %), the signal starts and ends
    with a ``gap_s`` silence, and white noise with RMS ``noise_db`` dB re full
    scale is added (``float("-inf")`` disables it).  ``impairment`` (one of
    :data:`IMPAIRMENTS`) spoils the middle tone so that a correct decoder hears
    :func:`heard` instead of ``digits``.  Same args -> same output.

    >>> x = synthesize("77", seed=1)
    >>> x.dtype, bool(np.abs(x).max() <= 1.0)
    (dtype('float32'), True)
    """
    bad = sorted(set(digits) - set(KEYS))
    if bad:
        raise ValueError(f"synthesize: unsupported symbols {bad!r}; allowed: {KEYS!r}")
    if sample_rate_hz <= 2 * max(HIGH_FREQS_HZ):
        raise ValueError(f"sample_rate_hz={sample_rate_hz} too low for DTMF tones")
    at = _impaired_index(digits, impairment) if impairment else -1
    rng = np.random.default_rng(seed)
    edge = np.zeros(int(round(gap_s * sample_rate_hz)))
    parts = [edge]
    for i, key in enumerate(digits):
        if i:
            gap = np.zeros(int(round(gap_s * rng.uniform(0.8, 1.2) * sample_rate_hz)))
            if not (i == at and impairment == "merged"):
                parts.append(gap)
        n = int(round(tone_s * rng.uniform(0.8, 1.2) * sample_rate_hz))
        amplitude = 0.5 * rng.uniform(0.8, 1.2)
        if i != at:
            parts.append(_tone(key, n, amplitude, sample_rate_hz, rng))
        elif impairment == "weak_high":
            parts.append(_tone(key, n, amplitude, sample_rate_hz, rng, high_gain=0.1))
        elif impairment == "merged":  # one press as long as two: the previous tone, held on
            parts[-1] = _tone(key, parts[-1].shape[0] + n, amplitude, sample_rate_hz, rng)
        elif impairment == "crosstalk":
            tone = _tone(key, n, amplitude, sample_rate_hz, rng)
            other_low = DTMF_FREQS_HZ[_neighbour_row_key(key)][0]
            t = np.arange(n, dtype=np.float64) / sample_rate_hz
            parts.append(tone + amplitude * np.sin(2 * math.pi * other_low * t + rng.uniform(0.0, 2.0 * math.pi)))
        else:  # talk_off: half a gap, a short stray key, the rest of the gap comes before the next key
            parts.append(_tone(key, n, amplitude, sample_rate_hz, rng))
            parts.append(np.zeros(int(round(gap_s * sample_rate_hz))))
            parts.append(_tone(_stray_key(digits, at), int(round(0.06 * sample_rate_hz)), 0.4, sample_rate_hz, rng))
    parts.append(edge)
    signal = np.concatenate(parts)
    signal += 10.0 ** (noise_db / 20.0) * rng.standard_normal(signal.shape[0])
    return np.clip(signal, -1.0, 1.0).astype(np.float32)


# --------------------------------------------------------------------------
# Corpus I/O
# --------------------------------------------------------------------------
def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp name, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def _wav_bytes(samples: np.ndarray, sample_rate_hz: int) -> bytes:
    """Encode float samples in [-1, 1] as a 16-bit PCM mono WAV file image."""
    pcm = np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate_hz)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def write_wav(path: str | os.PathLike, samples: np.ndarray, sample_rate_hz: int) -> None:
    """Atomically write ``samples`` (float, [-1, 1]) as 16-bit PCM mono WAV.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.wav"
    >>> write_wav(p, np.zeros(80, np.float32), 8000); read_wav(p)[1]
    8000
    """
    _atomic_write_bytes(Path(path), _wav_bytes(samples, sample_rate_hz))


def read_wav(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """Read a 16-bit PCM mono WAV file -> (float32 samples in [-1, 1], rate).

    Raises ``ValueError`` naming the file for other formats.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.wav"
    >>> write_wav(p, np.full(4, 0.5, np.float32), 8000)
    >>> x, sr = read_wav(p); x.shape, sr
    ((4,), 8000)
    """
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{path}: not a readable PCM WAV file ({exc})") from exc
    if channels != 1 or width != 2:
        raise ValueError(
            f"{path}: expected 16-bit mono PCM, got {8 * width}-bit with {channels} channel(s)"
        )
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0, rate


def make_corpus(
    out_dir: Path,
    n_utts: int,
    *,
    seed: int = 0,
    min_digits: int = 3,
    max_digits: int = 8,
    sample_rate_hz: int = 8000,
    noise_db: float = -30.0,
    impair_every: int = 0,
) -> Path:
    """Write a Kaldi-style corpus: ``wav/<utt>.wav``, ``wav.scp`` and ``text``.

    ``wav.scp`` paths are relative to ``out_dir`` (``wav/dtmf_000000.wav``) so
    the same arguments give byte-identical files in any directory; use
    :func:`read_corpus` to resolve them.  Every file is written atomically.

    With ``impair_every=N``, utterance ``i`` with ``i % N == N // 2`` gets one of
    :data:`IMPAIRMENTS` (in turn), so a correct decoder makes exactly one
    error on it (:func:`heard`); they are listed in ``impairments``
    (``<utt_id> <kind> <what is heard>``).  ``text`` is always what was dialled.

    >>> import tempfile, pathlib
    >>> d = make_corpus(pathlib.Path(tempfile.mkdtemp()), 2)
    >>> (d / "text").read_text().splitlines()[0].split()[0]
    'dtmf_000000'
    """
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    scp_lines, text_lines, impaired_lines = [], [], []
    for i in range(n_utts):
        utt_id = f"dtmf_{i:06d}"
        n_digits = int(rng.integers(min_digits, max_digits + 1))
        digits = "".join(KEYS[int(k)] for k in rng.integers(0, len(KEYS), size=n_digits))
        utt_seed = int(rng.integers(0, 2**31 - 1))
        impairment = None
        if impair_every > 0 and i % impair_every == impair_every // 2 and len(digits) >= 2:
            impairment = IMPAIRMENTS[(i // impair_every) % len(IMPAIRMENTS)]
            if impairment == "merged":
                at = len(digits) // 2
                digits = digits[:at] + digits[at - 1] + digits[at + 1:]
            impaired_lines.append(f"{utt_id} {impairment} {heard(digits, impairment)}\n")
        audio = synthesize(digits, sample_rate_hz=sample_rate_hz, noise_db=noise_db, seed=utt_seed,
                           impairment=impairment)
        rel = f"wav/{utt_id}.wav"
        write_wav(out_dir / rel, audio, sample_rate_hz)
        scp_lines.append(f"{utt_id} {rel}\n")
        text_lines.append(f"{utt_id} {digits}\n")
    if impaired_lines:
        _atomic_write_bytes(out_dir / "impairments", "".join(impaired_lines).encode())
    _atomic_write_bytes(out_dir / "wav.scp", "".join(sorted(scp_lines)).encode())
    _atomic_write_bytes(out_dir / "text", "".join(sorted(text_lines)).encode())
    return out_dir


def read_corpus(corpus_dir: Path) -> list[tuple[str, Path, str]]:
    """Read ``wav.scp`` + ``text`` -> sorted ``(utt_id, wav_path, digits)``.

    Relative wav paths are resolved against ``corpus_dir``.

    >>> import tempfile, pathlib
    >>> d = make_corpus(pathlib.Path(tempfile.mkdtemp()), 3)
    >>> [u for u, _, _ in read_corpus(d)]
    ['dtmf_000000', 'dtmf_000001', 'dtmf_000002']
    """
    corpus_dir = Path(corpus_dir)

    def table(name: str) -> dict[str, str]:
        lines = (corpus_dir / name).read_text().splitlines()
        return dict((ln.split(maxsplit=1) + [""])[:2] for ln in lines if ln.strip())

    wavs, texts = table("wav.scp"), table("text")
    if wavs.keys() != texts.keys():
        raise ValueError(f"{corpus_dir}: wav.scp and text list different utterances")
    return [(u, corpus_dir / wavs[u], texts[u]) for u in sorted(wavs)]


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------
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
        self.register_buffer("kernels", kernels, persistent=False)
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

        >>> DTMFDecoder()(*collate([synthesize("909", seed=3)]))
        ['909']
        """
        if wave.dim() != 2 or lengths.shape != (wave.shape[0],):
            raise ValueError(
                f"expected wave [B, T] and lengths [B], got {tuple(wave.shape)}, "
                f"{tuple(lengths.shape)}"
            )
        labels = self.frame_labels(wave, lengths).cpu().tolist()
        return ["".join(KEYS[k] for k in collapse(row, min_run=self.min_run)) for row in labels]

    def decode(self, wave_np: np.ndarray) -> str:
        """Decode one 1-D waveform sampled at ``sample_rate_hz``.

        >>> DTMFDecoder().decode(synthesize("31337", seed=7))
        '31337'
        """
        batch, lengths = collate([wave_np])
        return self(batch.to(self.kernels.device), lengths)[0]
