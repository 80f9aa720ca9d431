"""espnet3_prefect.espnet3.artifacts: what an SCP line holds for each output value, and the files written;
parity with ESPnet3 202611's writer (same values, same file bytes) where espnet3 is importable.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from espnet3_prefect.espnet3 import artifacts as A
from espnet3_prefect.espnet3 import contract as C
from tests.helpers.artifact_writers import Thing


def _upstream():
    try:
        if importlib.util.find_spec("espnet3.contract") is None:
            return None
        runner = importlib.import_module("espnet3.systems.base.inference_runner")
        writer = importlib.import_module("espnet3.utils.writer_utils")
        scp = importlib.import_module("espnet3.utils.scp_utils")
        return runner._materialize_output_value, writer.write_artifact, scp.check_utt_id
    except (ImportError, AttributeError):
        return None


UP = _upstream()
parity = pytest.mark.skipif(UP is None, reason="espnet3 (PyPI espnet==202611) is not importable")
needs_soundfile = pytest.mark.skipif(importlib.util.find_spec("soundfile") is None, reason="soundfile is not installed")


@pytest.fixture(autouse=True)
def standalone(monkeypatch):
    monkeypatch.setattr(C, "STANDALONE", True)


def materialize(value, out, field="f", utt="u1", config=None):
    return A.materialize_output_value(utt, field, value, out, config)


# ----------------------------------------------------------------------------- scalars


@pytest.mark.parametrize("value", ["a b  ", "", 0, -3, 2.5, True, False, np.float64(0.1), np.str_("x")])
def test_python_scalars_are_returned_as_they_are(tmp_path, value):
    assert materialize(value, tmp_path, utt="not an id") is value  # ids are checked only for files
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "value, expected",
    [
        (np.float32(0.5), 0.5),
        (np.int16(-3), -3),
        (np.bool_(True), True),
        (np.array(2.5), 2.5),
        (np.array("s"), "s"),
        (np.array(7, dtype=np.uint8), 7),
    ],
)
def test_numpy_scalars_and_0d_arrays_become_items(tmp_path, value, expected):
    got = materialize(value, tmp_path)
    assert got == expected and type(got) is type(expected)


def test_0d_tensor_is_an_item(tmp_path):
    torch = pytest.importorskip("torch")
    got = materialize(torch.tensor(3.5), tmp_path)
    assert got == 3.5 and type(got) is float


# ----------------------------------------------------------------------------- files


def test_arrays_and_tensors_are_npy_under_field_and_id(tmp_path):
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    path = materialize(array, tmp_path, field="post", utt="sp0.9-utt1")
    assert path == (tmp_path / "post" / "sp0.9-utt1.npy").as_posix() and isinstance(path, str)
    loaded = np.load(path)
    assert loaded.dtype == np.int16 and np.array_equal(loaded, array)
    torch = pytest.importorskip("torch")
    path = materialize(torch.ones(2, 3, requires_grad=True), tmp_path, field="post", utt="u2")
    assert np.load(path).dtype == np.float32 and path.endswith("/post/u2.npy")


def test_cuda_tensors_are_refused(tmp_path):
    torch = pytest.importorskip("torch")

    class OnCuda(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    with pytest.raises(ValueError, match="CUDA tensor"):
        materialize(torch.zeros(3).as_subclass(OnCuda), tmp_path)


def test_dicts_are_utf8_json_indented(tmp_path):
    value = {"speaker": "ünï 漢字", "segments": [1, [2, 3.5]], "none": None, "ok": True}
    path = materialize(value, tmp_path, field="meta")
    text = Path(path).read_text(encoding="utf-8")
    assert path.endswith("/meta/u1.json") and "漢字" in text and text.startswith('{\n  "speaker"')
    assert json.loads(text) == value


def test_json_that_cannot_be_serialized_leaves_no_file(tmp_path):
    with pytest.raises(TypeError):
        materialize({"x": np.float32(1)}, tmp_path, field="meta")
    assert not (tmp_path / "meta" / "u1.json").exists()


@pytest.mark.parametrize("value", [None, Thing(3), {1, 2}, b"raw"])
def test_other_objects_are_pickles(tmp_path, value):
    path = materialize(value, tmp_path)
    assert path.endswith("/f/u1.pkl")
    assert pickle.loads(Path(path).read_bytes()) == value


def test_counter_is_a_dict_so_json(tmp_path):
    assert materialize(collections.Counter("aab"), tmp_path).endswith(".json")


@pytest.mark.parametrize("value", [[1, 2], ("a",), []])
def test_top_level_lists_are_refused_naming_the_field(tmp_path, value):
    with pytest.raises(TypeError, match=r"field 'words' of utterance 'u1' is a (list|tuple)"):
        materialize(value, tmp_path, field="words")


@pytest.mark.parametrize("utt", ["", "a b", "x/y", "..", ".", "a\\b", "tab\there"])
def test_unsafe_ids_are_refused_for_files(tmp_path, utt):
    with pytest.raises(ValueError, match="utterance id"):
        materialize(np.zeros(2), tmp_path, utt=utt)
    with pytest.raises(ValueError):
        A.check_utt_id(utt)


def test_ids_keep_their_dots_and_any_id_becomes_a_string(tmp_path):
    assert materialize(np.zeros(1), tmp_path, utt="a.b.c").endswith("/f/a.b.c.npy")
    assert materialize(np.zeros(1), tmp_path, utt=17).endswith("/f/17.npy")
    assert A.check_utt_id(17) == "17"


def test_output_artifacts_types(tmp_path):
    array = np.arange(3)
    assert materialize(array, tmp_path, config={"type": "pickle"}).endswith(".pkl")
    assert materialize({"a": 1}, tmp_path, field="g", config={"type": "npy"}).endswith(".npy")
    assert materialize(array, tmp_path, field="h", config={"type": None}).endswith(".npy")
    with pytest.raises(ValueError, match="output_artifacts type 'mp3'"):
        materialize(array, tmp_path, config={"type": "mp3"})
    with pytest.raises(ValueError, match="sample_rate"):
        materialize(array, tmp_path, config={"type": "wav"})


def test_omegaconf_field_config(tmp_path):
    from omegaconf import OmegaConf

    config = OmegaConf.create({"rate": 8000, "f": {"type": "pickle", "sample_rate": "${rate}"}})
    assert A.write_artifact(np.zeros(2), tmp_path / "x", config.f).name == "x.pkl"


@needs_soundfile
def test_wav_from_arrays_and_audio(tmp_path):
    import soundfile

    frames_last = np.array([[0.5, -0.5], [0.25, 0.0], [0.0, 1.0]], dtype=np.float32)  # (frames, channels)
    path = materialize(frames_last, tmp_path, field="wav", config={"type": "wav", "sample_rate": 8000})
    info = soundfile.info(path)
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (8000, 2, 3, "PCM_16")
    stereo = C.Audio(frames_last, 16000)  # held as (channels, frames); written back as (frames, channels)
    path = materialize(stereo, tmp_path, field="speech")
    data, rate = soundfile.read(path, dtype="float32")
    assert rate == 16000 and data.shape == (3, 2) and np.allclose(data, frames_last, atol=1 / 32768)
    assert materialize(stereo, tmp_path, field="speech", utt="u2", config={"sample_rate": 8000}).endswith("u2.wav")
    assert soundfile.info(tmp_path / "speech" / "u2.wav").samplerate == 8000
    # another type keeps the Audio's (channels, frames) array
    path = materialize(stereo, tmp_path, field="arr", config={"type": "npy"})
    assert np.load(path).shape == (2, 3)


def test_custom_writer_function(tmp_path):
    config = {"writer": {"_target_": "tests.helpers.artifact_writers.write_text", "upper": True}, "lang": "en"}
    path = materialize("ignored: scalar", tmp_path, config=config)
    assert path == "ignored: scalar"
    path = materialize({"k": "v"}, tmp_path, field="meta", utt="u.1", config=config)
    assert path.endswith("/meta/u.1.txt") and Path(path).read_text() == "{'K': 'V'} LANG=EN"
    with pytest.raises(FileNotFoundError, match="never-written"):
        materialize(
            np.zeros(1), tmp_path, config={"writer": {"_target_": "tests.helpers.artifact_writers.return_missing"}}
        )
    with pytest.raises(TypeError, match="must return the path"):
        materialize(
            np.zeros(1), tmp_path, config={"writer": {"_target_": "tests.helpers.artifact_writers.return_number"}}
        )
    with pytest.raises(KeyError, match="needs a _target_"):
        materialize(np.zeros(1), tmp_path, config={"writer": {"upper": True}})


def test_write_artifact_accepts_str_paths_and_appends_the_suffix(tmp_path):
    path = A.write_artifact({"a": 1}, str(tmp_path / "d" / "x.y"))
    assert path == tmp_path / "d" / "x.y.json" and isinstance(path, Path)


# ============================================================================= parity with ESPnet3


def tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def both(tmp_path, run):
    """``run(materialize, write, out_dir)`` with ours (standalone) and with ESPnet3's functions."""
    up_materialize, up_write, _ = UP
    results = []
    for name, mat, write in (
        ("ours", A.materialize_output_value, A.write_artifact),
        ("espnet3", up_materialize, up_write),
    ):
        out = tmp_path / name
        out.mkdir()
        try:
            value = run(mat, write, out, name)
        except Exception as exc:  # noqa: BLE001 - compared below
            results.append(("error", exc, out))
        else:
            if isinstance(value, Path):
                value = ("path", value.relative_to(out).as_posix())
            elif isinstance(value, str) and value.startswith(out.as_posix()):
                value = ("path", value[len(out.as_posix()) :])
            results.append(("ok", value, out))
    (kind_a, a, out_a), (kind_b, b, out_b) = results
    if kind_b == "error":
        assert kind_a == "error", f"ESPnet3 raised {b!r}, we returned {a!r}"
        assert isinstance(a, type(b)), f"we raised {a!r}, ESPnet3 {b!r}"
        assert "\n" not in str(a)
        return
    assert kind_a == "ok", f"we raised {a!r}, ESPnet3 returned {b!r}"
    assert type(a) is type(b) and a == b, (a, b)
    files_a, files_b = tree(out_a), tree(out_b)
    assert list(files_a) == list(files_b)
    for name in files_a:
        assert files_a[name] == files_b[name], f"{name} differs"


def _values():
    rng = np.random.default_rng(1)
    return {
        "str_spaces": "  two  words ",
        "str_empty": "",
        "str_non_ascii": "ünï 漢字",
        "int": 12,
        "float": 0.1,
        "bool": False,
        "np_float64": np.float64(1 / 3),
        "np_float32": np.float32(1 / 3),
        "np_int16": np.int16(-7),
        "np_bool": np.bool_(True),
        "np_str": np.str_("s"),
        "0d_array": np.array(1 / 3),
        "0d_str_array": np.array("x"),
        "float32_2d": rng.standard_normal((3, 4)).astype(np.float32),
        "int16_1d": np.arange(-5, 5, dtype=np.int16),
        "float64_stereo": rng.standard_normal((50, 2)),
        "bool_array": np.array([True, False]),
        "object_array": np.array([1, "a", None], dtype=object),
        "complex": np.array([1 + 2j]),
        "fortran": np.asfortranarray(rng.standard_normal((3, 5))),
        "strided": np.arange(20.0).reshape(4, 5)[:, ::2],
        "empty_array": np.zeros((0, 3), dtype=np.float32),
        "big_endian": np.arange(4, dtype=">i4"),
        "dict": {
            "speaker": "spk1 ünï",
            "text": '漢字 "quoted" \\ back',
            "nested": [1, [2.5, [None, True]]],
            "empty": {},
            "nan": float("nan"),
            "inf": float("inf"),
            "neg_zero": -0.0,
            3: "int key",
        },
        "dict_empty": {},
        "ordered_dict": collections.OrderedDict([("b", 1), ("a", 2)]),
        "dict_with_numpy": {"x": np.float32(1)},
        "dict_surrogate": {"s": "\udcff"},
        "dict_with_bytes": {"a": b"raw"},
        "none": None,
        "object": Thing([1, "two"]),
        "set": {3, 1, 2},
        "bytes": b"\x00\xff",
        "frozenset": frozenset("ab"),
        "range": range(3),
        "lambda": lambda: 0,
        "list": [1, 2],
        "tuple": (1,),
        "empty_list": [],
        "nested_list_in_dict": {"words": [["a", "b"], ["c"]]},
    }


VALUES = _values()
CONFIGS = {
    "default": None,
    "npy": {"type": "npy"},
    "json": {"type": "json"},
    "pickle": {"type": "pickle"},
    "wav16k": {"type": "wav", "sample_rate": 16000},
    "wav_no_rate": {"type": "wav"},
    "unknown_type": {"type": "flac"},
    "writer": {"writer": {"_target_": "tests.helpers.artifact_writers.write_text", "suffix": ".log"}, "opt": 1},
    "writer_missing": {"writer": {"_target_": "tests.helpers.artifact_writers.return_missing"}},
    "writer_number": {"writer": {"_target_": "tests.helpers.artifact_writers.return_number"}},
}
NEEDS_SOUNDFILE = {"wav16k"}


@parity
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", sorted(VALUES))
def test_parity_materialize(tmp_path, name, config):
    if config in NEEDS_SOUNDFILE and importlib.util.find_spec("soundfile") is None:
        pytest.skip("soundfile is not installed")
    value = VALUES[name]

    def run(mat, write, out, side):
        return mat(
            idx_value="sp0.9-utt1", field_key="field", value=value, output_dir=out, artifact_config=CONFIGS[config]
        )

    both(tmp_path, run)


@parity
@pytest.mark.parametrize("config", ["default", "npy", "json", "pickle", "wav16k", "unknown_type", "writer"])
@pytest.mark.parametrize(
    "name", ["float32_2d", "dict", "object", "none", "list", "np_float32", "str_spaces", "int16_1d"]
)
def test_parity_write_artifact(tmp_path, name, config):
    value = VALUES[name]

    def run(mat, write, out, side):
        return write(value, out / "field" / "a.b", field_config=CONFIGS[config])

    both(tmp_path, run)


@parity
@pytest.mark.parametrize("utt", ["u1", "sp0.9-utt1", "a.b.c", 42, "x.npy", "", "a b", "a/b", "..", ".", "a\\b", "é"])
def test_parity_ids(tmp_path, utt):
    def run(mat, write, out, side):
        return mat(idx_value=utt, field_key="f", value=np.zeros(2), output_dir=out, artifact_config=None)

    both(tmp_path, run)
    try:
        expected = UP[2](utt)
    except ValueError:
        with pytest.raises(ValueError):
            A.check_utt_id(utt)
    else:
        assert A.check_utt_id(utt) == expected


TENSORS = {
    "float32_2d": lambda t: t.randn(3, 4),
    "int64": lambda t: t.arange(5),
    "0d": lambda t: t.tensor(2.5),
    "0d_int": lambda t: t.tensor(7),
    "grad": lambda t: t.ones(2, requires_grad=True),
    "bool": lambda t: t.tensor([True]),
    "bfloat16": lambda t: t.ones(2, dtype=t.bfloat16),
    "stereo_frames": lambda t: t.rand(40, 2) - 0.5,
    "noncontig": lambda t: t.arange(12.0).reshape(3, 4).T,
}


@parity
@pytest.mark.parametrize("config", ["default", "wav16k", "pickle", "writer"])
@pytest.mark.parametrize("name", sorted(TENSORS))
def test_parity_tensors(tmp_path, name, config):
    torch = pytest.importorskip("torch")
    if config in NEEDS_SOUNDFILE and importlib.util.find_spec("soundfile") is None:
        pytest.skip("soundfile is not installed")
    torch.manual_seed(0)
    value = TENSORS[name](torch)

    def run(mat, write, out, side):
        return mat(idx_value="u.1", field_key="t", value=value, output_dir=out, artifact_config=CONFIGS[config])

    both(tmp_path, run)


@parity
def test_parity_cuda_tensors_refused(tmp_path):
    torch = pytest.importorskip("torch")

    class OnCuda(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    def run(mat, write, out, side):
        return mat(
            idx_value="u", field_key="t", value=torch.zeros(3).as_subclass(OnCuda), output_dir=out, artifact_config=None
        )

    both(tmp_path, run)


@parity
@needs_soundfile
@pytest.mark.parametrize(
    "config",
    [None, {"sample_rate": 8000}, {"type": "npy"}, {"type": "pickle"}, {"type": "wav", "sample_rate": 22050}],
    ids=str,
)
@pytest.mark.parametrize(
    "shape, dtype",
    [
        ((100,), np.int16),
        ((100, 2), np.int16),
        ((2, 100), np.float32),
        ((3, 50), np.float64),
        ((1, 30), np.float32),
        ((40, 4), np.uint8),
    ],
    ids=str,
)
def test_parity_audio_values(tmp_path, shape, dtype, config):
    from espnet3.contract.kinds.audio import Audio as UpAudio

    rng = np.random.default_rng(2)
    array = (rng.uniform(-1.2, 1.2, shape) * (np.iinfo(dtype).max if np.issubdtype(dtype, np.integer) else 1)).astype(
        dtype
    )

    def run(mat, write, out, side):
        audio = (C.Audio if side == "ours" else UpAudio)(array, 16000)
        return mat(idx_value="sp1.1-u", field_key="speech", value=audio, output_dir=out, artifact_config=config)

    both(tmp_path, run)


@parity
def test_with_espnet3_importable_espnet3_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "STANDALONE", False)
    up_materialize, up_write, up_check = UP
    assert A._upstream("espnet3.systems.base.inference_runner", "_materialize_output_value") is up_materialize
    assert A._upstream("espnet3.utils.writer_utils", "write_artifact") is up_write
    assert A._upstream("espnet3.utils.scp_utils", "check_utt_id") is up_check
    # our Audio is handed over as ESPnet3's, so it is still written as a wav
    if importlib.util.find_spec("soundfile") is not None:
        path = A.materialize_output_value("u", "speech", C.Audio(np.zeros((2, 10), np.float32), 8000), tmp_path, None)
        assert path.endswith("/speech/u.wav")
    # and if the private helper disappears, ours runs (on ESPnet3's writer)
    monkeypatch.setitem(A._UPSTREAM_CACHE, ("espnet3.systems.base.inference_runner", "_materialize_output_value"), None)
    assert A.materialize_output_value("u", "d", {"a": "é"}, tmp_path, None).endswith("/d/u.json")
    assert (tmp_path / "d" / "u.json").read_text(encoding="utf-8") == '{\n  "a": "é"\n}'
