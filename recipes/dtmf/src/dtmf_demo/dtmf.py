"""Synthetic DTMF "speech recognition" demo: the data generator and its corpus files.

Utterances are sequences of keypad digits rendered as dual-tone (DTMF) bursts
separated by silences, plus white noise; some utterances can carry one
impairment (a weak tone, two presses merged, crosstalk, a stray key) that a
correct decoder mishears in a known way. :mod:`dtmf_demo.decoder`
turns the audio back into the digit string with a small torch model, so
inference outputs can be scored against references without downloading anything.
"""

from __future__ import annotations

import io
import math
import os
import wave
from pathlib import Path

import numpy as np

from espnet3_prefect._internal.atomic import atomic_open

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
    key: str, n: int, amplitude: float, sample_rate_hz: int, rng: np.random.Generator, high_gain: float = 1.0
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
    ['371', '371', '3741', '37701']
    """
    if impairment is None:
        return digits
    at = _impaired_index(digits, impairment)
    if impairment in ("weak_high", "merged"):
        return digits[:at] + digits[at + 1 :]
    if impairment == "crosstalk":
        return digits[:at] + _neighbour_row_key(digits[at]) + digits[at + 1 :]
    return digits[: at + 1] + _stray_key(digits, at) + digits[at + 1 :]


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
        raise ValueError(f"{path}: expected 16-bit mono PCM, got {8 * width}-bit with {channels} channel(s)")
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
                digits = digits[:at] + digits[at - 1] + digits[at + 1 :]
            impaired_lines.append(f"{utt_id} {impairment} {heard(digits, impairment)}\n")
        audio = synthesize(
            digits, sample_rate_hz=sample_rate_hz, noise_db=noise_db, seed=utt_seed, impairment=impairment
        )
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
