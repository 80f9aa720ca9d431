"""A word "recognizer" whose model is a checkpoint file, for evaluate tests.

The checkpoint holds one integer k: the model drops every k-th word of each reference (k = 0:
perfect). So WER is known in advance, and a new checkpoint at the same path changes the model.
Also two custom metrics: one streaming (``UttCount``), one on ESPnet3's list contract (``ExactMatch``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from espnet3_prefect._internal.scp import ScpField

SENTENCES = ["the cat sat", "on the mat today", "a b c d e f", "hello", "one two three four five"]


class WordDataset:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return {"utt_id": f"w{idx:04d}", "text": SENTENCES[idx % len(SENTENCES)]}


class WordOrganizer:
    def __init__(self, test=()):
        self.test = {t["name"]: WordDataset(t["n"]) for t in test}


class CheckpointModel:
    def __init__(self, checkpoint: str, device: str = "cpu"):
        self.drop_every = int(Path(checkpoint).read_text().strip() or 0)

    def __call__(self, text: Any) -> Any:
        if isinstance(text, list):
            return [self(t) for t in text]
        words = text.split()
        if self.drop_every <= 0:
            return text
        return " ".join(w for i, w in enumerate(words, 1) if i % self.drop_every)


def word_output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [word_output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "hyp": model_output, "ref": data["text"]}


def expected_wer(n: int, drop_every: int) -> float:
    words = [len(SENTENCES[i % len(SENTENCES)].split()) for i in range(n)]
    dropped = sum(w // drop_every for w in words) if drop_every > 0 else 0
    return round(100.0 * dropped / sum(words), 2)


class UttCount:
    """Streams its input (never loads it): number of utterances and of empty values."""

    name = "UTTS"

    def __init__(self, field: str = "hyp"):
        self.field = field

    def __call__(self, data, test_name, inference_dir):
        assert isinstance(data[self.field], ScpField)
        count = empty = 0
        for value in data[self.field]:
            count += 1
            empty += value == ""
        return {"UTTS": count, "empty": empty}


class ExactMatch:
    """Written against ESPnet3's list-of-strings contract: indexes and zips whole lists."""

    def __init__(self, ref_key: str = "ref", hyp_key: str = "hyp"):
        self.ref_key, self.hyp_key = ref_key, hyp_key

    def __call__(self, data, test_name, inference_dir):
        refs, hyps = data[self.ref_key], data[self.hyp_key]
        same = sum(r == h for r, h in zip(refs, hyps))
        return {"exact": round(100.0 * same / len(refs), 2), "first_ref": refs[0]}


def word_config(tmp_path: Path, n: int = 25, checkpoint: Path | None = None) -> dict:
    return {
        "inference_dir": str(tmp_path / "inference"),
        "dataset": {"_target_": "tests.helpers.wordrecipe.WordOrganizer", "test": [{"name": "dev", "n": n}]},
        "model": {
            "_target_": "tests.helpers.wordrecipe.CheckpointModel",
            "checkpoint": str(checkpoint or tmp_path / "model.ckpt"),
        },
        "input_key": "text",
        "output_fn": "tests.helpers.wordrecipe.word_output_fn",
        "output_keys": ["hyp", "ref"],
        "batch_size": 4,
        "provider": {"_target_": "espnet3.systems.base.inference_provider.InferenceProvider"},
        "runner": {"_target_": "espnet3.systems.base.inference_runner.InferenceRunner", "retries": 0},
        "parallel": {"env": "local", "n_workers": 1, "num_shards": 3},
    }


class CountingWordOrganizer(WordOrganizer):
    """A :class:`WordOrganizer` that logs ``<pid> <thread name>`` to ``log`` each time it is built
    (once per ``build_dataset``)."""

    def __init__(self, test=(), log=None):
        import os
        import threading

        super().__init__(test)
        if log:
            with open(log, "a") as f:
                f.write(f"dataset {os.getpid()} {threading.current_thread().name}\n")
