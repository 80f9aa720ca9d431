"""Item lengths from every source (pipeline/lengths.py): the dataset's lengths(), else its audio files'
headers (found as ESPnet3 202611's recipe datasets keep them, through ESPnet3's wrappers), else the
recipe's collect_stats shape files; the header lengths cached per files' fingerprint and read again when
the data changes; and what they change: the plan only under runner.max_duration."""

from __future__ import annotations

import importlib
import inspect
import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pytest

from espnet3_prefect.config.load import load_config
from espnet3_prefect.errors import BadInputError, ConfigError
from espnet3_prefect.pipeline import lengths as lengths_module
from espnet3_prefect.pipeline.lengths import audio_paths, header_lengths, lengths_from_files, shape_lengths
from espnet3_prefect.pipeline.resume import plan_for
from espnet3_prefect.pipeline.sizing import require_lengths, size_on_driver
from espnet3_prefect.pipeline.stage import build_stages
from tests.conftest import write_yaml

sf = pytest.importorskip("soundfile")


@pytest.fixture
def wavs(fsdd_dir, tmp_path):
    """Eight real recordings copied (so a test may change them), with their true durations (decoded)."""
    folder = tmp_path / "wavs"
    folder.mkdir()
    paths = []
    for source in sorted(Path(fsdd_dir).glob("*.wav"))[:8]:
        paths.append(Path(shutil.copy(source, folder / source.name)))
    decoded = [len(sf.read(p)[0]) / sf.info(p).samplerate for p in paths]
    return paths, decoded


# -- where the audio files are found -----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:  # mini_an4's ManifestEntry
    utt_id: str
    wav_path: Path
    text: str


class MiniAn4Like:
    """As egs3/mini_an4's MiniAn4Dataset keeps its items: ``_entries`` of records with ``wav_path``."""

    def __init__(self, paths):
        self._entries = [Entry(p.stem, p, "x") for p in paths]

    def __len__(self):
        return len(self._entries)

    reads = 0

    def __getitem__(self, i):
        MiniAn4Like.reads += 1  # what would decode the audio
        return {"speech": np.zeros(4, dtype=np.float32), "text": "x"}


class LibriLike:
    """As egs3/librispeech_100 and spgispeech keep theirs: ``_examples`` with ``audio_path`` (dicts here)."""

    def __init__(self, paths):
        self._examples = [{"utt_id": p.stem, "audio_path": str(p)} for p in paths]

    def __len__(self):
        return len(self._examples)

    def __getitem__(self, i):
        MiniAn4Like.reads += 1
        return {"speech": np.zeros(4, dtype=np.float32), "text": "x"}


class WithTransform:  # ESPnet3's DatasetWithTransform
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)


class Combined:  # ESPnet3's CombinedDataset (what build_dataset returns for a test set)
    def __init__(self, datasets):
        self.datasets = datasets

    def __len__(self):
        return sum(len(d) for d in self.datasets)


class Declared:
    """Our contract: ``audio_paths()``, one path per item in dataset order."""

    def __init__(self, paths, count=None):
        self.paths_, self.count = paths, count

    def __len__(self):
        return len(self.paths_)

    def audio_paths(self):
        return self.paths_[: self.count]


def test_audio_files_are_found_as_espnet3_recipes_keep_them_through_its_wrappers(tmp_path):
    paths = [tmp_path / f"{i}.wav" for i in range(4)]
    names = [str(p) for p in paths]
    MiniAn4Like.reads = 0
    assert audio_paths(MiniAn4Like(paths)) == names
    assert audio_paths(LibriLike(paths)) == names
    assert audio_paths(Combined([WithTransform(MiniAn4Like(paths[:2])), LibriLike(paths[2:])])) == names
    assert audio_paths(Declared(paths)) == names

    class Texts:
        paths = ["a.txt", "b.txt"]

        def __len__(self):
            return 2

    assert audio_paths(Texts()) is None  # a plain `paths` list counts only when it names audio files
    assert audio_paths([1, 2]) is None and audio_paths(Combined([WithTransform([0]), LibriLike(paths)])) is None
    with pytest.raises(BadInputError, match=r"^Declared.audio_paths\(\): returned 3 paths for 4 items"):
        audio_paths(Declared(paths, count=3))
    assert MiniAn4Like.reads == 0  # no item was read (decoded) to find its file


def test_the_real_espnet3_wrappers_are_looked_through(wavs):
    dataset_module = pytest.importorskip("espnet3.components.data.dataset")
    paths, _ = wavs
    combined = dataset_module.CombinedDataset(
        [MiniAn4Like(paths[:3]), LibriLike(paths[3:])], [(lambda x: x, lambda x: x)] * 2
    )
    MiniAn4Like.reads = 0  # ESPnet3's constructor reads item 0 of each part itself; we read none
    assert audio_paths(combined) == [str(p) for p in paths] and MiniAn4Like.reads == 0


def _require(module: str):
    """``module`` imported; a skip without the real ESPnet, a failure with E3P_REQUIRE_REAL_ESPNET=1."""
    if os.environ.get("E3P_REQUIRE_REAL_ESPNET") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.mark.parametrize(
    "recipe, dataset_class, attribute, record_class, field",
    [
        ("mini_an4", "MiniAn4Dataset", "_entries", "ManifestEntry", "wav_path"),
        ("librispeech_100", "LibriSpeech100Dataset", "_examples", "LibriSpeechExample", "audio_path"),
        ("spgispeech", "SPGISpeechDataset", "_examples", "SPGISpeechExample", "audio_path"),
    ],
)
def test_espnet3_202611_recipe_datasets_keep_the_private_records_read(
    tmp_path, recipe, dataset_class, attribute, record_class, field
):
    """The one private read (item_records): the installed recipes still keep their files there, and
    offer no public way to them (BaseDataset's __len__ and __getitem__, which decodes)."""
    module = _require(f"egs3.{recipe}.esp2_asr.dataset.dataset")
    cls, record = getattr(module, dataset_class), getattr(module, record_class)
    assert f"self.{attribute} = " in inspect.getsource(cls.__init__)
    public = [n for n in vars(cls) if not n.startswith("_") and n != "fields"]
    assert not public, f"{dataset_class} now has {public}: read the files through it, not {attribute}"
    dataset = object.__new__(cls)  # its __init__ prepares the corpus; only the records matter here
    dataset._hf_cache = None  # SPGISpeech: its HF cache unused
    paths = [tmp_path / f"{i}.wav" for i in range(3)]
    values = {"utt_id": "u", field: None, **{f.name: "x" for f in fields(record) if f.name not in ("utt_id", field)}}
    setattr(dataset, attribute, [record(**{**values, field: p}) for p in paths])
    assert audio_paths(dataset) == [str(p) for p in paths]


# -- headers, the cache, and changed data -------------------------------------------------------------


def test_header_lengths_are_the_decoded_durations_without_decoding(wavs, tmp_path):
    paths, decoded = wavs
    found = lengths_from_files(MiniAn4Like(paths), len(paths), "t", cache_file=None)
    assert found.source == "audio headers" and found.unit == "s" and found.seconds
    assert np.allclose(found.values, decoded, rtol=0, atol=1e-9)


def test_header_lengths_are_cached_and_read_again_when_the_data_changes(wavs, tmp_path, monkeypatch):
    paths, decoded = wavs
    cache = tmp_path / "inference/.lengths-cache/t.npz"
    first = header_lengths([str(p) for p in paths], cache)
    assert cache.is_file() and np.allclose(first, decoded)

    reads = []
    real = lengths_module.header_seconds
    monkeypatch.setattr(lengths_module, "header_seconds", lambda p: reads.append(p) or real(p))
    assert np.array_equal(header_lengths([str(p) for p in paths], cache), first) and reads == []  # the cache

    # the data changes: one recording becomes three joined (a longer file at the same path)
    audio, rate = sf.read(paths[2])
    sf.write(paths[2], np.concatenate([audio, audio, audio]), rate)
    again = header_lengths([str(p) for p in paths], cache)
    assert len(reads) == len(paths)  # read again (all of them: one fingerprint for the set)
    assert np.isclose(again[2], 3 * decoded[2]) and np.allclose(np.delete(again, 2), np.delete(first, 2))
    reads.clear()
    assert np.array_equal(header_lengths([str(p) for p in paths[:5]], cache), again[:5]) and len(reads) == 5
    assert np.array_equal(header_lengths([str(p) for p in paths[:5]], cache), again[:5]) and len(reads) == 5


def test_a_missing_or_unreadable_audio_file_fails_on_one_line_naming_it(wavs, tmp_path):
    paths, _ = wavs
    bad = tmp_path / "wavs" / "broken.wav"
    bad.write_bytes(b"not audio")
    with pytest.raises(BadInputError, match=rf"^item 8: audio file {bad}: cannot read its header"):
        header_lengths([str(p) for p in paths] + [str(bad)], None)
    gone = tmp_path / "gone.wav"
    with pytest.raises(BadInputError, match=rf"^item 0: audio file {gone}: "):
        header_lengths([str(gone)], None)


# -- shape files -------------------------------------------------------------------------------------


def test_shape_files_give_the_first_number_by_item_index(tmp_path):
    stats = tmp_path / "stats" / "valid"
    stats.mkdir(parents=True)
    (stats / "speech_shape").write_text("2 16000\n0 8000\n1 24000\n")
    found = lengths_from_files([0, 1, 2], 3, "valid", cache_file=None, stats_dir=tmp_path / "stats")
    assert found.values.tolist() == [8000.0, 24000.0, 16000.0] and not found.seconds
    assert found.unit == "samples or frames"  # raw audio's samples here; features' frames below
    (stats / "feats_shape").write_text("0 50,80\n1 150,80\n2 100,80\n")
    found = lengths_from_files([0, 1, 2], 3, "valid", cache_file=None, stats_dir=tmp_path / "stats", input_key="feats")
    assert found.values.tolist() == [50.0, 150.0, 100.0]
    assert lengths_from_files([0, 1, 2], 3, "test", cache_file=None, stats_dir=tmp_path / "stats") is None
    for text, why in (("0 1\n0 2\n2 3\n", "line 2"), ("0 1\n2 3\n", "no line for item 1"), ("utt1 5\n", "line 1")):
        (stats / "speech_shape").write_text(text)
        with pytest.raises(BadInputError, match=rf"^shape file .*speech_shape: .*{why}"):
            shape_lengths(stats / "speech_shape", 3)


# -- what they change: the plan only under max_duration ------------------------------------------------


def _stages(tmp_path, root, *overrides, limit=12):
    from tests.helpers.fsdd import fsdd_inference_config

    cfg = fsdd_inference_config(tmp_path / "inference", root, limit=limit, num_shards=3)
    return build_stages(load_config([write_yaml(tmp_path / "c.yaml", cfg)], list(overrides)))[1]


def test_without_max_duration_the_driver_reads_nothing_and_each_shard_reads_its_own_headers(wavs, tmp_path):
    from espnet3_prefect.disk.layout import StageLayout
    from espnet3_prefect.pipeline.plan import Shard
    from espnet3_prefect.pipeline.shard import process_shard
    from tests.helpers.fsdd import FsddDataset

    paths, decoded = wavs
    [stage] = _stages(tmp_path, paths[0].parent)
    sizing = size_on_driver(stage)
    assert sizing.lengths is None and sizing.lengths_id is None and sizing.unit is None  # as before the change
    assert not stage.layout.lengths_cache.exists()  # nothing read on the driver
    assert plan_for(stage, sizing.n_items, sizing.lengths) == plan_for(stage, sizing.n_items)

    class Frames:  # a runner whose forward reads the items (decodes them) as a real one does
        @staticmethod
        def forward(idx, dataset, **env):
            return [len(dataset[i]["speech"]) for i in idx]

        @staticmethod
        def open_writers(shard_dir, **env):
            return {"out": (shard_dir / "n.scp").open("w")}

        @staticmethod
        def write_record(writers, result, state, **env):
            writers["out"].write("".join(f"{n}\n" for n in result))

        @staticmethod
        def close_writers(writers, state, **env):
            writers["out"].close()

    env = {"dataset": FsddDataset(str(paths[0].parent)), "output_dir": str(tmp_path / "out")}
    layout = StageLayout(tmp_path / "out")
    summary = process_shard(Frames, Shard("fsdd", 0, 2, 7, batch_size=2), env, layout, prefetch=0)
    assert summary["lengths_unit"] == "s" and np.isclose(summary["padding"]["real"], sum(decoded[2:7]))
    picked = Shard("fsdd", 1, 0, 3, batch_size=2, indices=(6, 0, 3))  # runner(indices): its own items
    summary = process_shard(Frames, picked, env, layout, prefetch=0)
    assert np.isclose(summary["padding"]["real"], decoded[6] + decoded[0] + decoded[3])
    assert np.isclose(summary["padding"]["padded"], 2 * max(decoded[6], decoded[0]) + decoded[3])

    class Ids(Frames):  # a runner that never opens the audio
        @staticmethod
        def forward(idx, dataset, **env):
            return list(idx)

    said = []
    paths[4].write_bytes(b"no longer audio")  # the report's business only: the shard itself is unaffected
    summary = process_shard(Ids, Shard("fsdd", 2, 3, 6, batch_size=2), env, layout, prefetch=0, log=said.append)
    assert summary["failed"] == 0 and (layout.shard_dir(2) / "done").is_file()
    assert "padding" not in summary and "lengths_unit" not in summary
    assert len(said) == 1 and said[0].startswith("split.2: audio lengths not read for the report (item 4: audio file")


def test_with_max_duration_header_lengths_plan_and_cut_the_batches(wavs, tmp_path):
    paths, decoded = wavs
    [stage] = _stages(tmp_path, paths[0].parent, "+runner.max_duration=2.0")
    require_lengths(stage, stage.runner.provider.build_dataset(stage.config))  # the precheck: found, not read
    sizing = size_on_driver(stage)
    assert np.allclose(sizing.lengths, decoded) and sizing.lengths_id and sizing.source == "audio headers"
    for shard in plan_for(stage, sizing.n_items, sizing.lengths):
        for batch in shard.forward_units():
            assert len(batch) == 1 or max(decoded[i] for i in batch) * len(batch) <= 2.0


def test_with_max_duration_and_no_source_the_key_is_refused_on_one_line(tmp_path):
    from tests.conftest import toy_config

    cfg = toy_config(tmp_path, n=6, num_shards=2, batch_size=2)
    [stage] = build_stages(load_config([write_yaml(tmp_path / "c.yaml", cfg)], ["+runner.max_duration=3"]))[1]
    expected = r"^runner.max_duration: test set 'test_a': its dataset \(ToyDataset\) has no lengths\(\).*audio_paths"
    with pytest.raises(ConfigError, match=expected):
        size_on_driver(stage)
