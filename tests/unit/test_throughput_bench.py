"""benchmarks/throughput.py's parts that decide what it reports, on the real FSDD recordings (no
ESPnet, no flow): the audio set, the lengths it gives the planner, the budgets, the scoring (the
padding it reports is the run's summary's)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from benchmarks import throughput as tp
from espnet3_prefect.pipeline.duration import duration_batches

pytestmark = pytest.mark.skipif(not any(tp.FSDD.glob("*.wav")), reason=f"no FSDD recordings in {tp.FSDD}")


def test_joined_digits_lengths_are_the_audio_seconds_and_spread_10x():
    data = tp.JoinedDigits(n_single=20, n_joined=10, join=(4, 30))
    lengths = data.lengths()
    assert len(data) == len(lengths) == 30
    for i in range(len(data)):
        item = data[i]
        assert item["speech"].dtype == np.float32
        assert abs(len(item["speech"]) / tp.RATE - lengths[i]) < 0.01 * len(item["text"].split())
        assert all(word in tp.WORDS for word in item["text"].split())
    assert lengths.max() / lengths.min() >= 10
    # seeded: the same items in the same order on every call, another seed another order
    again = tp.JoinedDigits(n_single=20, n_joined=10, join=(4, 30))
    assert again.items == data.items
    assert tp.JoinedDigits(n_single=20, n_joined=10, join=(4, 30), seed=1).items != data.items


def test_lengths_come_from_headers(tmp_path):
    path = tmp_path / "0_x_0.wav"
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(8000)
        handle.writeframes(np.zeros(12000, "<i2").tobytes())
    data = tp.JoinedDigits(root=str(tmp_path), n_single=1, n_joined=1, join=(3, 3))
    assert sorted(data.lengths().tolist()) == [1.5, 4.5]
    assert len(data[int(np.argmax(data.lengths()))]["speech"]) == 3 * 24000


def test_budget_is_the_largest_padded_upstream_batch():
    seconds = np.array([1.0, 3.0, 5.0, 1.0, 1.0])
    assert tp.upstream_batches(5, 2, 2) == [[0, 1], [2, 3], [4]]
    assert tp.largest_padded(tp.upstream_batches(5, 2, 2), seconds) == 10.0
    for batch in duration_batches(range(5), seconds, 10.0, 16):
        assert max(seconds[batch]) * len(batch) <= 10.0


def test_error_rates():
    assert tp.error_rate(["ONE TWO THREE"], ["ONE TWO THREE"], "word") == 0.0
    assert tp.error_rate(["ONE TWO", "SIX"], ["ONE", "SIX SIX"], "word") == pytest.approx(200 / 3, abs=0.01)
    assert tp.error_rate(["ONE"], [""], "char") == 100.0


def test_speech2text_args_point_the_tokenizer_at_the_model_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.yaml").write_text(
        f"token_list: {tp.TOKENIZER_DIR}tokens.txt\nbpemodel: {tp.TOKENIZER_DIR}bpe.model\n"
    )
    (model / "model.ckpt").write_bytes(b"")
    args = tp.speech2text_args(model, tmp_path)
    text = Path(args["asr_train_config"]).read_text()
    assert f"token_list: {model.resolve()}/tokens.txt" in text and f"bpemodel: {model.resolve()}/bpe.model" in text
    assert args["asr_model_file"] == str((model / "model.ckpt").resolve())
    (model / "config.yaml").write_text("token_list: /elsewhere/tokens.txt\n")
    with pytest.raises(ValueError, match="config.yaml"):
        tp.speech2text_args(model, tmp_path)
