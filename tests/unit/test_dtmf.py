"""Tests for the synthetic DTMF demo recipe (dtmf_demo.dtmf)."""

from __future__ import annotations

import time
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from dtmf_demo.decoder import DTMFDecoder, collapse, collate
from dtmf_demo.dtmf import (
    DTMF_FREQS_HZ,
    IMPAIRMENTS,
    KEYS,
    heard,
    make_corpus,
    read_corpus,
    read_wav,
    synthesize,
    write_wav,
)


@pytest.fixture(scope="module")
def decoder() -> DTMFDecoder:
    return DTMFDecoder()


def _random_digits(rng: np.random.Generator, lo: int = 3, hi: int = 8) -> str:
    return "".join(KEYS[int(k)] for k in rng.integers(0, 10, size=int(rng.integers(lo, hi + 1))))


def test_frequency_table_is_standard() -> None:
    assert KEYS == "0123456789"
    assert DTMF_FREQS_HZ["1"] == (697.0, 1209.0)
    assert DTMF_FREQS_HZ["5"] == (770.0, 1336.0)
    assert DTMF_FREQS_HZ["9"] == (852.0, 1477.0)
    assert DTMF_FREQS_HZ["0"] == (941.0, 1336.0)
    assert set(DTMF_FREQS_HZ) == set(KEYS)


def test_synthesize_deterministic_and_seed_dependent() -> None:
    a = synthesize("0123", seed=5)
    b = synthesize("0123", seed=5)
    c = synthesize("0123", seed=6)
    assert a.dtype == np.float32 and a.ndim == 1
    np.testing.assert_array_equal(a, b)
    assert a.shape != c.shape or not np.array_equal(a, c)
    assert np.abs(a).max() <= 1.0
    assert 0.3 < np.abs(a).max() < 0.8  # amplitude ~0.5 (+-20 %) plus noise


def test_synthesize_rejects_unknown_symbols() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        synthesize("12#", seed=0)


def test_make_corpus_byte_identical(tmp_path: Path) -> None:
    d1 = make_corpus(tmp_path / "a", 12, seed=3)
    d2 = make_corpus(tmp_path / "b", 12, seed=3)
    files1 = sorted(p.relative_to(d1) for p in d1.rglob("*") if p.is_file())
    files2 = sorted(p.relative_to(d2) for p in d2.rglob("*") if p.is_file())
    assert files1 == files2
    assert len(files1) == 12 + 2  # wavs + wav.scp + text, no temp leftovers
    for rel in files1:
        assert (d1 / rel).read_bytes() == (d2 / rel).read_bytes(), rel
    scp = (d1 / "wav.scp").read_text().splitlines()
    assert scp == sorted(scp)
    assert scp[0] == "dtmf_000000 wav/dtmf_000000.wav"
    texts = [ln.split() for ln in (d1 / "text").read_text().splitlines()]
    assert all(3 <= len(t[1]) <= 8 and set(t[1]) <= set(KEYS) for t in texts)
    x, sr = read_wav(d1 / "wav" / "dtmf_000000.wav")
    assert sr == 8000 and x.dtype == np.float32 and np.abs(x).max() <= 1.0


def test_decoder_accuracy_on_corpus(tmp_path: Path, decoder: DTMFDecoder) -> None:
    corpus = read_corpus(make_corpus(tmp_path / "c", 200, seed=0))
    assert len(corpus) == 200
    waves, refs = [], []
    for _, path, ref in corpus:
        x, sr = read_wav(path)
        assert sr == decoder.sample_rate_hz
        waves.append(x)
        refs.append(ref)
    hyps: list[str] = []
    for i in range(0, len(waves), 50):
        hyps += decoder(*collate(waves[i : i + 50]))
    errors = [(r, h) for r, h in zip(refs, hyps) if r != h]
    assert not errors, errors[:10]


def test_batch_matches_single(decoder: DTMFDecoder) -> None:
    rng = np.random.default_rng(11)
    waves = [synthesize(_random_digits(rng, 1, 10), seed=100 + i) for i in range(16)]
    assert len({w.shape[0] for w in waves}) > 1
    batch, lengths = collate(waves)
    assert batch.shape == (16, max(w.shape[0] for w in waves))
    assert lengths.tolist() == [w.shape[0] for w in waves]
    singles = [decoder.decode(w) for w in waves]
    assert decoder(batch, lengths) == singles
    # Frame labels of each item are unaffected by padding.
    batch_labels = decoder.frame_labels(batch, lengths)
    for i, w in enumerate(waves):
        x, n = collate([w])
        single = decoder.frame_labels(x, n)[0]
        assert torch.equal(batch_labels[i, : single.shape[0]], single)
        assert bool((batch_labels[i, single.shape[0] :] == -1).all())


def test_padding_never_creates_keys(decoder: DTMFDecoder) -> None:
    short = synthesize("42", seed=1)
    loud = synthesize("9999", seed=2, noise_db=float("-inf"))
    batch, lengths = collate([short, loud])
    batch[0, short.shape[0] :] = torch.from_numpy(loud[: batch.shape[1] - short.shape[0]])
    assert decoder(batch, lengths)[0] == "42"
    assert decoder(batch, torch.tensor([0, lengths[1]])) == ["", "9999"]


@pytest.mark.parametrize("digits", ["77", "000", "1111", "5577", "3", "99899"])
def test_repeated_digits(decoder: DTMFDecoder, digits: str) -> None:
    for seed in range(10):
        assert decoder.decode(synthesize(digits, seed=seed)) == digits


def test_silence_and_short_inputs(decoder: DTMFDecoder) -> None:
    assert decoder.decode(synthesize("", seed=0)) == ""
    assert decoder.decode(np.zeros(10, np.float32)) == ""
    assert decoder.decode(np.random.default_rng(0).normal(0, 0.03, 8000).astype(np.float32)) == ""


def test_decoder_deterministic_and_fixed() -> None:
    waves = [synthesize("8675309", seed=s) for s in range(4)]
    batch, lengths = collate(waves)
    d1, d2 = DTMFDecoder(), DTMFDecoder()
    assert list(d1.parameters()) == []
    out = d1(batch, lengths)
    assert out == ["8675309"] * 4
    assert d1(batch, lengths) == out == d2(batch, lengths)
    assert torch.equal(d1.frame_labels(batch, lengths), d2.frame_labels(batch, lengths))


def test_other_sample_rate() -> None:
    dec = DTMFDecoder(sample_rate_hz=16000)
    assert dec.decode(synthesize("2468", sample_rate_hz=16000, seed=4)) == "2468"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_matches_cpu() -> None:
    waves = [synthesize("13579", seed=s) for s in range(8)]
    batch, lengths = collate(waves)
    cpu = DTMFDecoder()
    gpu = DTMFDecoder().to("cuda")
    assert gpu(batch.cuda(), lengths.cuda()) == cpu(batch, lengths)
    assert gpu.decode(waves[0]) == "13579"


def _write_raw_wav(path: Path, channels: int, width: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(8000)
        w.writeframes(b"\x80" * (channels * width * 100))


@pytest.mark.parametrize(("name", "channels", "width"), [("stereo.wav", 2, 2), ("eightbit.wav", 1, 1)])
def test_read_wav_rejects_bad_format(tmp_path: Path, name: str, channels: int, width: int) -> None:
    path = tmp_path / name
    _write_raw_wav(path, channels, width)
    with pytest.raises(ValueError, match=name):
        read_wav(path)


def test_read_wav_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / "garbage.wav"
    path.write_bytes(b"not a wav file at all")
    with pytest.raises(ValueError, match="garbage.wav"):
        read_wav(path)


def test_wav_round_trip(tmp_path: Path) -> None:
    x = synthesize("123", seed=0)
    write_wav(tmp_path / "x.wav", x, 8000)
    y, sr = read_wav(tmp_path / "x.wav")
    assert sr == 8000 and y.shape == x.shape
    assert np.abs(y - x).max() < 1e-3
    assert [p.name for p in tmp_path.iterdir()] == ["x.wav"]


def test_collapse() -> None:
    assert collapse([-1, 7, 7, -1, 7, 7]) == [7, 7]
    assert collapse([7, 7, 3, 7, 7]) == [7]  # 1-frame glitch inside a tone is dropped
    assert collapse([-1, 4, -1, 5, 5]) == [5]  # 1-frame key run is dropped
    assert collapse([]) == []


# -- impairments: the demo's test_noisy makes a few real, known errors ---------------------------


@pytest.mark.parametrize("kind", IMPAIRMENTS)
def test_each_impairment_is_misheard_exactly_as_heard_says(decoder: DTMFDecoder, kind: str) -> None:
    rng = np.random.default_rng(21)
    cases, waves = [], []
    for seed in range(40):
        digits = _random_digits(rng, 2, 8)
        if kind == "merged":
            at = len(digits) // 2
            digits = digits[:at] + digits[at - 1] + digits[at + 1 :]
        assert heard(digits, kind) != digits and abs(len(heard(digits, kind)) - len(digits)) <= 1
        for noise_db in (-35.0, -22.0):
            cases.append((digits, seed, noise_db))
            waves.append(synthesize(digits, noise_db=noise_db, seed=seed, impairment=kind))
    hyps = decoder(*collate(waves))
    wrong = [(case, hyp) for case, hyp in zip(cases, hyps) if hyp != heard(case[0], kind)]
    assert not wrong, wrong[:5]


def test_impairment_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown impairment 'loud'"):
        synthesize("123", seed=0, impairment="loud")
    with pytest.raises(ValueError, match="repeated middle key"):
        synthesize("123", seed=0, impairment="merged")
    with pytest.raises(ValueError, match="2\\+ digits"):
        heard("7", "weak_high")
    assert heard("1234", None) == "1234"


def test_corpus_with_impairments_lists_them_and_decodes_to_them(tmp_path: Path, decoder: DTMFDecoder) -> None:
    out = make_corpus(tmp_path / "n", 60, seed=4, noise_db=-22.0, impair_every=10)
    listed = [line.split() for line in (out / "impairments").read_text().splitlines()]
    assert [u for u, _, _ in listed] == [f"dtmf_{i:06d}" for i in (5, 15, 25, 35, 45, 55)]
    assert [k for _, k, _ in listed] == [*IMPAIRMENTS, *IMPAIRMENTS[:2]]
    corpus = read_corpus(out)
    hyps = decoder(*collate([read_wav(path)[0] for _, path, _ in corpus]))
    wrong = {u: h for (u, _, ref), h in zip(corpus, hyps) if h != ref}
    assert wrong == {u: said for u, _, said in listed}
    plain = make_corpus(tmp_path / "p", 60, seed=4, noise_db=-22.0)
    assert not (plain / "impairments").exists()
    same = [(u, t) for (u, _, t) in read_corpus(plain)]
    assert [x for i, x in enumerate(same) if i % 10 != 5] == [
        (u, t) for i, (u, _, t) in enumerate(corpus) if i % 10 != 5
    ]  # only the impaired ones differ
    for i, (_, path, _) in enumerate(read_corpus(plain)):  # the audio too, byte for byte
        assert (path.read_bytes() == (out / "wav" / path.name).read_bytes()) == (i % 10 != 5), path.name


def test_demo_test_sets_clean_has_no_error_noisy_has_eight(tmp_path: Path, decoder: DTMFDecoder) -> None:
    from dtmf_demo.recipe import DEMO_TEST_SETS, prepare

    t0 = time.perf_counter()
    clean, noisy = prepare(tmp_path / "data")
    generate_s = time.perf_counter() - t0
    errors = {}
    for folder in (clean, noisy):
        corpus = read_corpus(folder)
        hyps: list[str] = []
        for i in range(0, len(corpus), 50):
            hyps += decoder(*collate([read_wav(path)[0] for _, path, _ in corpus[i : i + 50]]))
        errors[folder.name] = {u: (ref, h) for (u, _, ref), h in zip(corpus, hyps) if h != ref}
    assert len(read_corpus(noisy)) == DEMO_TEST_SETS["test_noisy"]["n_utts"] == 200
    assert errors["test_clean"] == {}
    assert len(errors["test_noisy"]) == 8  # WER 4.00 % on test_noisy: every one a single-digit edit
    kinds = [line.split()[1] for line in (noisy / "impairments").read_text().splitlines()]
    assert sorted(kinds) == sorted(IMPAIRMENTS * 2)
    print(f"\ndemo data: 500 utterances generated in {generate_s:.1f} s")


def test_prepare_regenerates_older_data_and_the_flow_hook_keeps_any_size(tmp_path: Path) -> None:
    from dtmf_demo.recipe import DTMFDataset, DTMFOrganizer, prepare

    old = make_corpus(tmp_path / "data/test_noisy", 5, seed=2, noise_db=-22.0)  # data from before the spec file
    fingerprint = DTMFDataset(old).fingerprint()
    entry = [{"name": "test_noisy", "data_dir": str(old)}]
    assert DTMFOrganizer.ensure_prepared(entry) == [old]  # older generator: made again, full size
    assert len(read_corpus(old)) == 200 and (old / "impairments").is_file()
    assert DTMFDataset(old).fingerprint() != fingerprint  # so finished shards of the old data re-run
    prepare(tmp_path / "data", scale=0.1)
    assert len(read_corpus(old)) == 20
    assert DTMFOrganizer.ensure_prepared(entry) == []  # the flow's hook keeps the chosen scale
    assert len(read_corpus(old)) == 20
