"""Data for the parity recipes: real recordings (FSDD) or generated DTMF tones, read lazily.

An organizer in ESPnet3's shape: ``Organizer(test=[{name, source, root, ...}]).test[name]`` is a
dataset whose items are ``{"utt_id", "speech" (float32 array), "text"}``. The real
``DataOrganizer`` imports torchaudio, which does not load beside torch 2.13, so the parity
recipes bring this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dtmf_demo.dtmf import read_corpus, read_wav

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def fsdd_entries(root: str | Path, limit: int = 13, stride: int = 47, offset: int = 0) -> list[tuple[str, Path, str]]:
    """Every ``stride``-th recording from ``offset`` (so the 13 cover speakers and digits), sorted.

    The reference text is the spoken digit as a word (``3_theo_7.wav`` -> ``three``).
    """
    paths = sorted(Path(root).glob("*.wav"))[offset::stride][:limit]
    if not paths:
        raise FileNotFoundError(f"no FSDD recordings under {root}")
    return [(p.stem, p, DIGIT_WORDS[int(p.stem.split("_")[0])]) for p in paths]


class ParityDataset:
    """``(utt_id, wav path, text)`` entries; items are read from disk when asked for."""

    def __init__(self, entries: Sequence[tuple[str, Path, str]]):
        self.entries = list(entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        utt_id, path, text = self.entries[idx]
        speech, _rate = read_wav(path)
        return {"utt_id": utt_id, "speech": speech, "text": text}


def build_test_set(entry: Mapping[str, Any]) -> ParityDataset:
    source = entry.get("source", "dtmf")
    if source == "fsdd":
        return ParityDataset(
            fsdd_entries(
                entry["root"], int(entry.get("limit", 13)), int(entry.get("stride", 47)), int(entry.get("offset", 0))
            )
        )
    if source == "dtmf":
        entries = read_corpus(Path(entry["root"]))[: int(entry.get("limit", 13))]
        return ParityDataset(entries)
    raise ValueError(f"unknown parity data source {source!r}")


class Organizer:
    """``test``: ``[{name, source: fsdd|dtmf, root, limit}]``. ``recipe_dir`` and ``preprocessor``
    are accepted (and unused) because the TEMPLATE config passes them to its organizer."""

    def __init__(self, test: Sequence[Mapping[str, Any]] = (), recipe_dir: str | None = None, preprocessor: Any = None):
        self.recipe_dir = recipe_dir
        self.test = {entry["name"]: build_test_set(entry) for entry in test}
