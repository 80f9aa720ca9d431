"""The DTMF demo recipe: ESPnet3-style organizer, dataset, model and output_fn.

``recipes/dtmf/conf/inference.yaml`` points at these classes; ``prepare`` makes the audio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dtmf_demo.dtmf import make_corpus, read_corpus, read_wav

# the decoder (torch) is imported where the model is built: the data step and a re-run whose test sets
# are all done never import torch (the demo's re-run: 1.2 s less)

# test set name -> make_corpus arguments. test_noisy: louder noise, and every 25th utterance has one
# impaired tone (8 of 200: 2 each of weak tone, merged presses, crosstalk, stray key), so the demo
# model makes 8 real, deterministic errors there (WER 4.00 %) and none on test_clean.
DEMO_TEST_SETS = {
    "test_clean": {"n_utts": 300, "noise_db": -35.0, "seed": 1},
    "test_noisy": {"n_utts": 200, "noise_db": -22.0, "seed": 2, "impair_every": 25},
}
GENERATOR_VERSION = 2  # bump when the same arguments would give other audio or text
SPEC_FILE = "corpus.json"


def _stored_spec(out: Path) -> dict | None:
    """The spec a complete test set in ``out`` was made with; None for none, a half-written or an older one."""
    try:
        spec = json.loads((out / SPEC_FILE).read_text())
    except (OSError, ValueError):
        return None
    return spec if (out / "text").is_file() and spec.get("generator") == GENERATOR_VERSION else None


def _make(out: Path, spec: dict, *, any_size: bool = False) -> bool:
    """Generate one demo test set unless ``out`` holds ``spec``'s (with ``any_size``: any ``n_utts``
    of this generator); data of an older generator is made again. True when it generated."""
    wanted = {**spec, "generator": GENERATOR_VERSION}
    stored = _stored_spec(out)
    if stored is not None and (stored == wanted or (any_size and {**stored, "n_utts": 0} == {**wanted, "n_utts": 0})):
        return False
    (out / SPEC_FILE).unlink(missing_ok=True)
    (out / "impairments").unlink(missing_ok=True)
    make_corpus(out, **spec)
    (out / SPEC_FILE).write_text(json.dumps(wanted, sort_keys=True) + "\n")
    return True


class DTMFDataset:
    """Items ``{"utt_id", "speech" (float32 array), "text"}`` of a corpus folder, in utt_id order."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        if not (self.data_dir / "wav.scp").is_file():
            raise FileNotFoundError(f"{self.data_dir / 'wav.scp'}: not found; run the demo's prepare step first")
        self.entries = read_corpus(self.data_dir)

    def __len__(self) -> int:
        return len(self.entries)

    def fingerprint(self) -> str:
        """Changes when the corpus lists or the generator's spec change, so regenerated data redoes
        finished shards (also when only the audio changed)."""
        sha = hashlib.sha256()
        for name in ("wav.scp", "text", SPEC_FILE):
            if name != SPEC_FILE or (self.data_dir / name).is_file():
                sha.update((self.data_dir / name).read_bytes())
        return sha.hexdigest()

    def audio_paths(self) -> list[Path]:
        """One wav per item, in dataset order: the run reads their headers (nothing decoded) for its
        RTFx, padding efficiency and per-worker rates."""
        return [path for _, path, _ in self.entries]

    def __getitem__(self, idx: int) -> dict[str, Any]:
        utt_id, path, text = self.entries[idx]
        speech, _ = read_wav(path)
        return {"utt_id": utt_id, "speech": speech, "text": text}


class DTMFOrganizer:
    """A minimal data organizer: ``test`` is a list of ``{name, data_dir}``; ``.test[name]`` a dataset."""

    def __init__(self, test: Sequence[dict] = ()):
        self.test = {entry["name"]: DTMFDataset(entry["data_dir"]) for entry in test}

    @staticmethod
    def ensure_prepared(test: Sequence[dict] = ()) -> list[Path]:
        """Generate the demo test sets named in ``test`` whose ``data_dir`` is not complete yet.

        The infer flow calls this before any worker starts, so a deployment of the demo runs
        from a fresh clone. Test sets with other names are left alone.
        """
        made = []
        for entry in test:
            spec = DEMO_TEST_SETS.get(entry.get("name"))
            if spec is not None and entry.get("data_dir") and _make(Path(entry["data_dir"]), spec, any_size=True):
                made.append(Path(entry["data_dir"]))
        return made


class DTMFRecognizer:
    """Model with the ESPnet3 call shape: ``model(speech=array)`` -> text, or a list for a batch.

    ``model_file`` (the demo's checkpoint key, ``model.model_file`` in the config): a file written by
    ``torch.save`` holding the decoder's state dict (``{"kernels": ...}``), bare or under
    ``"state_dict"`` (Lightning's layout, where ``epoch``/``global_step`` sit beside it); without it the
    decoder keeps its built-in filter bank.
    """

    def __init__(self, sample_rate_hz: int = 8000, device: str = "cpu", model_file: str | None = None):
        from dtmf_demo.decoder import DTMFDecoder

        self.decoder = DTMFDecoder(sample_rate_hz)
        if model_file:
            self.decoder.load_state_dict(load_state(model_file))
        self.decoder.to(device)
        self.device = device

    def __call__(self, speech: Any) -> Any:
        from dtmf_demo.decoder import collate

        batch = isinstance(speech, list)
        waves, lengths = collate(speech if batch else [speech])
        texts = self.decoder(waves.to(self.device), lengths.to(self.device))
        return texts if batch else texts[0]

    def eval(self) -> DTMFRecognizer:
        self.decoder.eval()
        return self


def load_state(model_file: str | Path) -> dict:
    """The decoder state dict in a demo checkpoint (bare, or under ``state_dict``/``model``)."""
    import torch

    state = torch.load(Path(model_file), map_location="cpu", weights_only=True)
    if isinstance(state, dict):
        for key in ("state_dict", "model"):
            if isinstance(state.get(key), dict):
                return state[key]
    if not isinstance(state, dict):
        raise ValueError(f"model_file {model_file}: holds a {type(state).__name__}, not a state dict")
    return state


def output_fn(data: Any, model_output: Any, idx: Any) -> Any:
    """``{"utt_id", "hyp", "ref"}`` per item (a list for a batch)."""
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "hyp": model_output, "ref": data["text"]}


def prepare(data_root: str | Path, scale: float = 1.0) -> list[Path]:
    """Generate the demo test sets under ``data_root`` (skipped where already complete)."""
    made = []
    for name, spec in DEMO_TEST_SETS.items():
        out = Path(data_root) / name
        _make(out, {**spec, "n_utts": max(1, int(spec["n_utts"] * scale))})
        made.append(out)
    return made


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate the DTMF demo audio.")
    parser.add_argument("--data-root", default="exp/dtmf/data")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default sizes")
    args = parser.parse_args(argv)
    for path in prepare(args.data_root, args.scale):
        print(path)


if __name__ == "__main__":
    main()
