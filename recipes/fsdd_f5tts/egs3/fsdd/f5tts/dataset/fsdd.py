"""FSDD recordings as an F5-TTS corpus: each recording's text is its digit as a word.

The source is the FSDD ``recordings/`` folder (``{digit}_{speaker}_{take}.wav``, mono 8 kHz),
linked or copied to ``<recipe>/downloads/fsdd`` (nothing is downloaded). ``create_dataset`` writes
three manifests, ``utt_id<TAB>wav_path<TAB>text<TAB>speaker[<TAB>reference_wav<TAB>reference_text]``,
the columns ESPnet3's ``remove_long_short`` and ``create_token_list`` read:

- ``train``: takes 0-1 of every digit, the first two speakers (40 recordings);
- ``valid``: take 2 of digits 0-3, the first speaker (4);
- ``test``: take 3 of digits 0-3, alternating between the first two speakers (4), each with a
  reference recording of the same speaker (take 4 of digit ``(d + 5) % 10``), the zero-shot
  prompt F5-TTS clones the voice of.

Training items are ``{speech, text}``; test items add ``reference_speech`` and ``reference_text``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from espnet3.components.data.base_dataset import BaseDataset
from espnet3.components.data.dataset_builder import DatasetBuilder
from espnet3.contract import Field

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SOURCE = Path("downloads") / "fsdd"
MANIFESTS = Path("data") / "manifest"
SPLITS = ("train", "valid", "test")


def _recordings(recipe_dir: str | Path) -> Path:
    return Path(recipe_dir).resolve() / SOURCE / "recordings"


def _speakers(recordings: Path) -> list[str]:
    return sorted({p.stem.split("_")[1] for p in recordings.glob("*_*_*.wav")})


def _rows(recordings: Path) -> dict[str, list[str]]:
    speakers = _speakers(recordings)[:2]
    if len(speakers) < 2:
        raise RuntimeError(f"create_dataset: {recordings} holds fewer than two FSDD speakers")

    def wav(digit: int, speaker: str, take: int) -> Path:
        path = recordings / f"{digit}_{speaker}_{take}.wav"
        if not path.is_file():
            raise RuntimeError(f"create_dataset: missing FSDD recording {path}")
        return path

    def row(digit: int, speaker: str, take: int, *extra: str) -> str:
        utt = f"{speaker}_{digit}_{take}"
        return "\t".join([utt, str(wav(digit, speaker, take)), WORDS[digit], speaker, *extra])

    rows = {
        "train": [row(d, s, t) for s in speakers for d in range(10) for t in (0, 1)],
        "valid": [row(d, speakers[0], 2) for d in range(4)],
        "test": [],
    }
    for d in range(4):
        speaker, reference = speakers[d % 2], (d + 5) % 10
        rows["test"].append(row(d, speaker, 3, str(wav(reference, speaker, 4)), WORDS[reference]))
    return rows


class FsddBuilder(DatasetBuilder):
    """Writes ``data/manifest/{train,valid,test}.tsv`` from ``downloads/fsdd/recordings``."""

    def is_source_prepared(self, recipe_dir: str | Path = ".", **_kwargs) -> bool:
        return _recordings(recipe_dir).is_dir()

    def prepare_source(self, recipe_dir: str | Path = ".", **_kwargs) -> None:
        raise RuntimeError(
            f"create_dataset: no FSDD recordings at {_recordings(recipe_dir)}; link the Free Spoken Digit "
            f"Dataset's folder (the one holding recordings/) to {Path(recipe_dir).resolve() / SOURCE}"
        )

    def is_built(self, recipe_dir: str | Path = ".", **_kwargs) -> bool:
        root = Path(recipe_dir).resolve() / MANIFESTS
        return all((root / f"{split}.tsv").is_file() for split in SPLITS)

    def build(self, recipe_dir: str | Path = ".", **_kwargs) -> None:
        root = Path(recipe_dir).resolve() / MANIFESTS
        root.mkdir(parents=True, exist_ok=True)
        for split, rows in _rows(_recordings(recipe_dir)).items():
            tmp = root / f".{split}.tsv.tmp"
            tmp.write_text("".join(f"{r}\n" for r in rows), encoding="utf-8")
            tmp.replace(root / f"{split}.tsv")


class FsddDataset(BaseDataset):
    """One manifest's rows as ``{speech, text}`` (+ ``reference_speech``, ``reference_text`` where the
    manifest has them: the test split)."""

    def __init__(self, split: str, manifest_dir: str | Path = MANIFESTS) -> None:
        if split not in SPLITS:
            raise ValueError(f"FsddDataset: unknown split {split!r}; expected one of {SPLITS}")
        self.manifest = Path(manifest_dir) / f"{split}.tsv"
        if not self.manifest.is_file():
            raise FileNotFoundError(f"FsddDataset: no manifest {self.manifest} (run the create_dataset stage)")
        lines = self.manifest.read_text(encoding="utf-8").splitlines()
        self.rows = [line.split("\t") for line in lines if line.strip()]
        if not self.rows:
            raise RuntimeError(f"FsddDataset: empty manifest {self.manifest}")
        fields = [Field("speech", "audio"), Field("text", "text")]
        if len(self.rows[0]) >= 6:
            fields += [Field("reference_speech", "audio"), Field("reference_text", "text")]
        self.fields = tuple(fields)

    def __len__(self) -> int:
        return len(self.rows)

    def audio_paths(self) -> list[str]:
        """One audio file per item, in dataset order, whose header gives the item's length in seconds
        (RTFx, ``runner.max_duration``): the recording whose text the item is, about as long as what
        F5-TTS generates for it (the reference prompt's length is the same for every item)."""
        return [row[1] for row in self.rows]

    def __getitem__(self, idx: int) -> dict[str, Any]:
        row = self.rows[int(idx)]
        item: dict[str, Any] = {"speech": _read(row[1]), "text": row[2]}
        if len(row) >= 6:
            item["reference_speech"] = _read(row[4])
            item["reference_text"] = row[5]
        return item


def _read(path: str) -> np.ndarray:
    array, _rate = sf.read(path, dtype="float32")
    return array
