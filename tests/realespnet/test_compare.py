"""The comparison helpers are strict: these run everywhere (no ESPnet needed)."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .compare import compared_files, inference_problems, stats_problems

SPH2PIPE = Path(__file__).resolve().parent / "sph2pipe"


def inference_dir(root: Path, *, hyp: str = "HELLO WORLD") -> Path:
    for name in ("test", "valid"):
        folder = root / name
        (folder / "dataset").mkdir(parents=True)
        (folder / "text.scp").write_text(f"utt1 {hyp}\n")
        (folder / "dataset" / "text.scp").write_text("utt1 HELLO WORLD\n")
        (folder / "split.0").mkdir()
        (folder / "split.0" / "text.scp").write_text(f"utt1 {hyp}\n")
        for alignment in ("wer_alignment", "cer_alignment"):
            (folder / alignment).write_text(f"{alignment} of utt1\n")
    (root / "metrics.json").write_text('{"wer": 0.0}\n')
    return root


def stats_dir(root: Path, *, scale: float = 1.0, count: int = 7) -> Path:
    for mode in ("train", "valid"):
        folder = root / mode
        folder.mkdir(parents=True)
        (folder / "feats_shape").write_text("utt1 10,80\n")
        (folder / "stats_keys").write_text("utt1\n")
        np.savez(
            folder / "feats_stats.npz",
            count=np.array(count),
            sum=np.full(80, 3.0) * scale,
            sum_square=np.full(80, 9.0) * scale,
        )
    return root


def test_identical_inference_dirs_agree(tmp_path):
    oracle = inference_dir(tmp_path / "a")
    assert inference_problems(oracle, inference_dir(tmp_path / "b")) == []
    assert "test/dataset/text.scp" in compared_files(oracle)
    assert not any("split." in rel for rel in compared_files(oracle))


def test_a_changed_hypothesis_is_reported_with_its_line(tmp_path):
    problems = inference_problems(inference_dir(tmp_path / "a"), inference_dir(tmp_path / "b", hyp="HELLO"))
    assert any("differs" in p and "line 1" in p and "text.scp" in p for p in problems), problems


@pytest.mark.parametrize("victim", ["metrics.json", "valid/wer_alignment", "test/dataset/text.scp"])
def test_a_missing_file_of_ours_fails(tmp_path, victim):
    oracle, ours = inference_dir(tmp_path / "a"), inference_dir(tmp_path / "b")
    (ours / victim).unlink()
    assert any("missing" in p and victim in p for p in inference_problems(oracle, ours))


def test_an_empty_or_absent_folder_fails_on_either_side(tmp_path):
    oracle = inference_dir(tmp_path / "a")
    (tmp_path / "empty").mkdir()
    assert inference_problems(oracle, tmp_path / "empty")
    assert inference_problems(oracle, tmp_path / "absent")
    assert inference_problems(tmp_path / "empty", oracle)  # an empty oracle proves nothing
    assert inference_problems(tmp_path / "absent", oracle)


def test_an_oracle_without_merged_scp_is_incomplete(tmp_path):
    oracle = inference_dir(tmp_path / "a")
    (oracle / "test" / "text.scp").unlink()
    with pytest.raises(AssertionError, match="no merged"):
        compared_files(oracle)
    assert any("oracle incomplete" in p for p in inference_problems(oracle, inference_dir(tmp_path / "b")))


def test_an_extra_merged_file_of_ours_fails(tmp_path):
    oracle, ours = inference_dir(tmp_path / "a"), inference_dir(tmp_path / "b")
    (ours / "test" / "score.scp").write_text("utt1 1\n")
    assert any("score.scp" in p for p in inference_problems(oracle, ours))


def test_stats_within_rounding_agree_and_beyond_it_fail(tmp_path):
    oracle = stats_dir(tmp_path / "a")
    assert stats_problems(oracle, stats_dir(tmp_path / "b", scale=1 + 1e-7)) == []
    assert any("relative difference" in p for p in stats_problems(oracle, stats_dir(tmp_path / "c", scale=1.001)))
    assert any("[count]" in p for p in stats_problems(oracle, stats_dir(tmp_path / "d", count=8)))


def test_stats_missing_files_fail(tmp_path):
    oracle, ours = stats_dir(tmp_path / "a"), stats_dir(tmp_path / "b")
    (ours / "valid" / "stats_keys").unlink()
    (ours / "train" / "feats_stats.npz").unlink()
    problems = stats_problems(oracle, ours)
    assert any("stats_keys" in p for p in problems) and any("feats_stats.npz" in p for p in problems)
    (tmp_path / "empty").mkdir()
    assert stats_problems(tmp_path / "empty", ours)
    assert stats_problems(oracle, tmp_path / "empty")


def sphere(path: Path, samples: np.ndarray, rate: int, big_endian: bool) -> None:
    """A NIST SPHERE PCM16 file written by hand (no libsndfile needed)."""
    fields = [
        f"sample_count -i {samples.shape[0]}",
        f"sample_rate -i {rate}",
        "sample_n_bytes -i 2",
        f"sample_byte_format -s2 {'10' if big_endian else '01'}",
        f"channel_count -i {samples.shape[1]}",
        "sample_coding -s3 pcm",
        "end_head",
    ]
    header = ("NIST_1A\n   1024\n" + "\n".join(fields) + "\n").encode().ljust(1024, b" ")
    path.write_bytes(header + samples.astype(">i2" if big_endian else "<i2").tobytes())


@pytest.mark.parametrize("big_endian", [False, True])
def test_sph2pipe_writes_a_44_byte_header_wav_of_one_channel(tmp_path, big_endian):
    assert SPH2PIPE.stat().st_mode & stat.S_IXUSR, "sph2pipe must be executable"
    samples = np.arange(-600, 600, 3, dtype=np.int16).reshape(-1, 2)
    sphere(tmp_path / "a.sph", samples, 8000, big_endian)
    out = subprocess.run(
        [sys.executable, str(SPH2PIPE), "-f", "wav", "-p", "-c", "2", str(tmp_path / "a.sph")],
        capture_output=True,
        check=True,
    ).stdout
    assert out[:4] == b"RIFF" and out[8:16] == b"WAVEfmt " and out[36:40] == b"data"
    assert int.from_bytes(out[24:28], "little") == 8000 and int.from_bytes(out[22:24], "little") == 1
    assert np.array_equal(np.frombuffer(out[44:], "<i2"), samples[:, 1])
    subprocess.run(
        [sys.executable, str(SPH2PIPE), "-f", "raw", str(tmp_path / "a.sph"), str(tmp_path / "a.raw")], check=True
    )
    assert np.array_equal(np.frombuffer((tmp_path / "a.raw").read_bytes(), "<i2").reshape(-1, 2), samples)


def test_sph2pipe_refuses_what_it_cannot_do(tmp_path):
    sphere(tmp_path / "a.sph", np.zeros((4, 1), np.int16), 16000, False)
    for args in (["-c", "2"], ["-f", "sph"], ["-t", "0:1"]):
        proc = subprocess.run([sys.executable, str(SPH2PIPE), *args, str(tmp_path / "a.sph")], capture_output=True)
        assert proc.returncode == 2 and proc.stderr.startswith(b"sph2pipe: "), (args, proc.stderr)
