"""espnet3_prefect.espnet3.contract: the standalone implementation's behaviour, and its parity with
ESPnet3 202611's ``espnet3.contract.inference`` (parity tests skip where espnet3 is not importable).
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.espnet3 import contract as C


def _upstream():
    try:
        if importlib.util.find_spec("espnet3.contract") is None:
            return None
        return importlib.import_module("espnet3.contract.inference")
    except ImportError:
        return None


UP = _upstream()
parity = pytest.mark.skipif(UP is None, reason="espnet3 (PyPI espnet==202611) is not importable")
HAS_SOUNDFILE = importlib.util.find_spec("soundfile") is not None
HAS_LIBROSA = importlib.util.find_spec("librosa") is not None
needs_soundfile = pytest.mark.skipif(not HAS_SOUNDFILE, reason="soundfile is not installed")


@pytest.fixture(autouse=True)
def standalone(monkeypatch):
    """Every test here runs our implementation unless it calls ESPnet3's explicitly."""
    monkeypatch.setattr(C, "STANDALONE", True)


def load(inputs, outputs, **extra):
    return C.load_inference_contract({"inputs": inputs, "outputs": outputs, **extra})


TEXT_IO = ({"text": {"kind": "text"}}, {"hyp": {"kind": "text"}})


# ----------------------------------------------------------------------------- loading


def test_none_is_none_and_dictconfig_is_accepted():
    from omegaconf import OmegaConf

    assert C.load_inference_contract(None) is None
    assert C.resolve_inference_contract(None) is None
    cfg = OmegaConf.create(
        {
            "sr": 16000,
            "contract": {
                "inputs": {"speech": {"kind": "audio", "sample_rate": "${sr}", "label": "Input Audio"}},
                "outputs": {"text": {"kind": "text", "normalize": ["strip", "to_lower"]}},
            },
        }
    )
    contract = C.load_inference_contract(cfg.contract)
    speech, text = contract.inputs[0], contract.outputs[0]
    assert (speech.name, speech.kind, speech.label, dict(speech.options)) == (
        "speech",
        "audio",
        "Input Audio",
        {"sample_rate": 16000},
    )
    assert text.label == "Text" and text.options == {"normalize": ["strip", "to_lower"]}
    assert C.resolve_inference_contract(OmegaConf.to_container(cfg.contract, resolve=True)).inputs == contract.inputs
    assert C.resolve_inference_contract(contract) is contract


@pytest.mark.parametrize(
    "config, error, key",
    [
        (
            {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "segments"}}},
            ConfigError,
            "contract.outputs.y.kind: 'segments' needs espnet3 installed (pip install espnet==202611)",
        ),
        (
            {"imports": ["src.contracts"], "inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.imports: ['src.contracts'] needs espnet3 installed (pip install espnet==202611)",
        ),
        (
            {"inputs": {"x": {"kind": "messages"}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.x.kind: unknown kind 'messages'",
        ),
        (
            {"inputs": {"x": {"label": "X"}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.x.kind is missing",
        ),
        (
            {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}, "normalize": ["strip"]},
            ConfigError,
            "contract: unknown key(s) ['normalize']",
        ),
        (
            {"inputs": {"x": {"kind": "text", "sample_rate": 16000}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.x: unknown option(s) ['sample_rate'] for kind 'text'",
        ),
        (
            {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text", "normalize": ["nfkc"]}}},
            ConfigError,
            "contract.outputs.y.normalize: unknown normalizer(s) ['nfkc'] for kind 'text'",
        ),
        (
            {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "number", "normalize": "strip"}}},
            ConfigError,
            "contract.outputs.y.normalize: unknown normalizer(s) ['strip'] for kind 'number'",
        ),
        (
            {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text", "normalize": 3}}},
            C.ContractTypeError,
            "contract.outputs.y.normalize must be a normalizer name or a list of names",
        ),
        (
            {"inputs": {"x": {"kind": "audio", "sample_rate": "16k"}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.x.sample_rate must be an integer > 0, got '16k'",
        ),
        (
            {"inputs": {"x": {"kind": "audio", "rate_policy": "keep"}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.x.rate_policy must be 'resample' or 'reject', got 'keep'",
        ),
        (
            {"inputs": {"x": {"kind": "audio", "channels": 0}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.x.channels must be null or >= 1",
        ),
        (
            {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text", "optional": True}}},
            ConfigError,
            "contract.outputs.y.optional: a declared output is always produced",
        ),
        (
            {"inputs": {"1x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
            ConfigError,
            "contract.inputs.1x: field name '1x' must be a Python identifier",
        ),
        ({"inputs": {}, "outputs": {"y": {"kind": "text"}}}, ConfigError, "contract.inputs needs at least one field"),
        ({"inputs": {"x": {"kind": "text"}}}, ConfigError, "contract.outputs needs at least one field"),
        (
            {"inputs": {"x": "text"}, "outputs": {"y": {"kind": "text"}}},
            C.ContractTypeError,
            "contract.inputs.x must be a mapping such as {kind: text}, got str",
        ),
        (
            {"imports": "src.contracts", "inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
            C.ContractTypeError,
            "contract.imports must be a list of module names",
        ),
    ],
)
def test_config_errors_name_the_key_on_one_line(config, error, key):
    with pytest.raises(error) as info:
        C.load_inference_contract(config)
    message = str(info.value)
    assert key in message and "\n" not in message
    assert isinstance(info.value, ConfigError)  # a ValueError; ContractTypeError is a TypeError too


def test_imports_refused_without_trust_and_contract_not_a_mapping():
    with pytest.raises(ConfigError, match="trust_user_code"):
        C.load_inference_contract({"imports": ["m"], "inputs": TEXT_IO[0], "outputs": TEXT_IO[1]}, allow_imports=False)
    with pytest.raises(TypeError, match="contract must be a mapping"):
        C.load_inference_contract(["inputs"])
    with pytest.raises(TypeError, match="InferenceContract or its mapping form"):
        C.resolve_inference_contract("contract.yaml")


def test_empty_imports_are_fine_and_channels_is_a_field_key():
    contract = load({"mix": {"kind": "audio", "channels": 2}}, TEXT_IO[1], imports=[])
    assert contract.imports == () and contract.inputs[0].channels == 2 and contract.inputs[0].options == {}


def test_validate_input_keys():
    contract = load({"speech": {"kind": "audio"}, "prompt": {"kind": "text", "optional": True}}, TEXT_IO[1])
    contract.validate_input_keys(["prompt", "speech"])
    for bad in ("speech", ["speech", "speech", "prompt"], ["speech", "prompt", "x"]):
        with pytest.raises(ValueError, match=r"input_key .* must name each field of contract.inputs"):
            contract.validate_input_keys(bad)
    with pytest.raises(ValueError, match="input_key must be set"):
        contract.validate_input_keys(None)


# ----------------------------------------------------------------------------- text and number


def test_text_normalizers_run_in_order_on_inputs_and_outputs():
    contract = load(
        {"text": {"kind": "text", "normalize": "strip"}},
        {
            "hyp": {"kind": "text", "normalize": ["strip", "to_upper"]},
            "low": {"kind": "text", "normalize": ["to_lower"]},
        },
    )
    prepared, original = C.prepare_inference_inputs([{"text": "  Hi There ", "utt_id": "a"}], 0, contract, None)
    assert prepared == {0: {"text": "Hi There", "utt_id": "a"}}
    assert original == {0: {"text": "  Hi There ", "utt_id": "a"}}
    out = C.validate_inference_outputs(
        {"low": " MiXed ", "hyp": " hello world "}, 0, contract, None, original, "utt_id"
    )
    assert out == {"hyp": "HELLO WORLD", "low": " mixed ", "utt_id": "a"}
    assert list(out) == ["hyp", "low", "utt_id"]  # declared order, then the id


@pytest.mark.parametrize("value", [3, 2.5, np.float32(0.25), np.int64(7)])
def test_number_accepts_reals_unchanged(value):
    contract = load(TEXT_IO[0], {"score": {"kind": "number"}})
    out = C.validate_inference_outputs({"score": value}, 5, contract, None, {5: {}}, "utt_id")
    assert out["score"] is value and out["utt_id"] == "5"


@pytest.mark.parametrize("value", [True, np.bool_(False), "1", None])
def test_number_refuses_bools_and_non_numbers_naming_the_field(value):
    contract = load(TEXT_IO[0], {"score": {"kind": "number"}})
    with pytest.raises(TypeError, match=r"output 'score' of dataset index 5 must be a real number"):
        C.validate_inference_outputs({"score": value}, 5, contract, None, {5: {}}, "utt_id")


def test_text_type_error_names_field_and_index():
    contract = load(*TEXT_IO)
    with pytest.raises(TypeError, match=r"^input 'text' of dataset index 2 must be a str, got int$"):
        C.prepare_inference_inputs([None, None, {"text": 3}], [2], contract, None)


def test_inputs_missing_optional_and_non_mapping():
    contract = load({"text": {"kind": "text"}, "prompt": {"kind": "text", "optional": True}}, TEXT_IO[1])
    prepared, _ = C.prepare_inference_inputs(
        [{"text": "a"}, {"text": "b", "prompt": None}, {"text": "c", "prompt": "p", "extra": 1}],
        [0, 1, 2],
        contract,
        None,
    )
    assert prepared == {0: {"text": "a"}, 1: {"text": "b"}, 2: {"text": "c", "prompt": "p", "extra": 1}}
    with pytest.raises(KeyError, match="contract.inputs.text: required input 'text' is missing from dataset index 0"):
        C.prepare_inference_inputs([{"prompt": "p"}], 0, contract, None)
    with pytest.raises(TypeError, match="dataset index 0 must be a mapping"):
        C.prepare_inference_inputs([("a",)], 0, contract, None)


# ----------------------------------------------------------------------------- outputs


def test_batched_mapping_of_lists_is_split_and_ids_come_from_result_then_sample_then_index():
    contract = load(*TEXT_IO)
    original = {3: {"utt_id": "s3"}, 4: {}, 9: {"utt_id": "s9"}}
    out = C.validate_inference_outputs(
        {"hyp": ["a", "b", "c"], "utt_id": ["r3", "r4", "r9"]}, [3, 4, 9], contract, None, original, "utt_id"
    )
    assert out == [{"hyp": "a", "utt_id": "r3"}, {"hyp": "b", "utt_id": "r4"}, {"hyp": "c", "utt_id": "r9"}]
    out = C.validate_inference_outputs(
        [{"hyp": "a"}, {"hyp": "b"}, {"hyp": "c"}], (3, 4, 9), contract, None, original, "utt_id"
    )
    assert [o["utt_id"] for o in out] == ["s3", "4", "s9"]
    # a batch of one may return a bare mapping; a single index may return a one-item list
    assert C.validate_inference_outputs({"hyp": "x"}, [4], contract, None, original, "utt_id") == [
        {"hyp": "x", "utt_id": "4"}
    ]
    assert C.validate_inference_outputs([{"hyp": "x"}], 4, contract, None, original, "utt_id") == {
        "hyp": "x",
        "utt_id": "4",
    }


@pytest.mark.parametrize(
    "result, idx, error, text",
    [
        ({"hyp": ["a"]}, [1, 2], ValueError, "one output mapping per sample"),
        ([{"hyp": "a"}], [1, 2], ValueError, "one output mapping per sample"),
        ({"hyp": "a", "score": 1}, 1, ValueError, "output(s) ['score'] are not declared in contract.outputs ['hyp']"),
        ({}, 1, KeyError, "contract.outputs.hyp: declared output 'hyp' is missing"),
        ("a", 1, TypeError, "dataset index 1: with a contract the model"),
    ],
)
def test_output_errors(result, idx, error, text):
    contract = load(*TEXT_IO)
    with pytest.raises(error) as info:
        C.validate_inference_outputs(result, idx, contract, None, {1: {}, 2: {}}, "utt_id")
    assert text in str(info.value)


def test_idx_key_cannot_be_a_declared_output():
    contract = load(TEXT_IO[0], {"utt_id": {"kind": "text"}})
    with pytest.raises(ValueError, match="contract.outputs.utt_id: 'utt_id' is the idx_key"):
        C.validate_inference_outputs({"utt_id": "a"}, 0, contract, None, {0: {}}, "utt_id")


# ----------------------------------------------------------------------------- audio


def audio_contract(model_rate=None, **options):
    return load({"speech": {"kind": "audio", **options}}, {"wav": {"kind": "audio", **options}}), SimpleNamespace(
        sample_rate=model_rate
    )


def prepare_one(value, model_rate=None, **options):
    contract, model = audio_contract(model_rate, **options)
    return C.prepare_inference_inputs([{"speech": value}], 0, contract, model)[0][0]["speech"]


def test_int16_mono_array_is_scaled_and_the_model_receives_an_audio():
    samples = np.array([0, 16384, -32768, 32767], dtype=np.int16)
    audio = prepare_one(samples, sample_rate=8000)
    assert isinstance(audio, C.Audio) and audio.rate == 8000 and audio.array.dtype == np.float32
    np.testing.assert_array_equal(audio.array, samples / 32768.0)


def test_layouts_pairs_and_unsigned_pcm():
    frames_last = prepare_one((8000, np.ones((2, 5), dtype=np.float32)), 8000)
    frames_first = prepare_one([8000, np.ones((5, 2), dtype=np.float32)], 8000)
    assert frames_last.array.shape == frames_first.array.shape == (2, 5)
    assert frames_last.array.flags.c_contiguous and frames_first.array.flags.c_contiguous
    assert prepare_one((np.int64(8000), np.ones((1, 5)))).array.shape == (5,)  # one channel is mono
    assert prepare_one((8000, np.ones((2, 1)))).array.shape == (2, 1)  # too short to tell: kept
    np.testing.assert_array_equal(
        prepare_one((8000, np.array([0, 128, 255], dtype=np.uint8))).array,
        np.array([-1.0, 0.0, 127 / 128], dtype=np.float32),
    )


def test_rate_comes_from_option_then_model_and_bare_arrays_need_one():
    assert prepare_one(np.zeros(4), model_rate=22050).rate == 22050
    assert prepare_one(np.zeros(4), model_rate=22050, sample_rate=8000).rate == 8000
    assert prepare_one((44100, np.zeros(4))).rate == 44100  # no rate fixed: a pair keeps its own
    with pytest.raises(TypeError, match=r"^input 'speech' of dataset index 0: cannot tell the sample rate"):
        prepare_one(np.zeros(4))


def test_tensors_are_taken_at_the_declared_rate():
    torch = pytest.importorskip("torch")
    audio = prepare_one(torch.tensor([[0, 16384, 0], [0, 0, -16384]], dtype=torch.int16), sample_rate=8000)
    np.testing.assert_array_equal(audio.array, [[0, 0.5, 0], [0, 0, -0.5]])


def test_channels_and_channel_normalizers():
    stereo = (8000, np.array([[0.5, 1.0], [0.25, 0.0], [0.0, -1.0]], dtype=np.float32))  # (frames, channels)
    with pytest.raises(
        TypeError, match="input 'speech' of dataset index 0 has 2 channel.s., contract wants channels: 1"
    ):
        prepare_one(stereo, channels=1)
    first = prepare_one(stereo, channels=1, normalize=["first_channel"])
    np.testing.assert_array_equal(first.array, [0.5, 0.25, 0.0])
    mean = prepare_one(stereo, normalize="mean_channels")
    np.testing.assert_array_equal(mean.array, np.array([0.75, 0.125, -0.5], dtype=np.float32))
    assert prepare_one((8000, np.zeros(3)), normalize=["first_channel", "mean_channels"]).array.shape == (3,)


def test_reject_policy_and_resampling_without_librosa(monkeypatch):
    with pytest.raises(ValueError, match=r"input 'speech' of dataset index 0 has sample rate 8000, expected 16000"):
        prepare_one((8000, np.zeros(4)), sample_rate=16000, rate_policy="reject")
    assert prepare_one(np.zeros(4), sample_rate=16000, rate_policy="reject").rate == 16000  # a bare array carries none
    monkeypatch.setitem(sys.modules, "librosa", None)
    with pytest.raises(ModuleNotFoundError) as info:
        prepare_one((8000, np.zeros(4)), sample_rate=16000)
    message = str(info.value)
    assert message.startswith("input 'speech' of dataset index 0: audio at 8000 Hz must be resampled to 16000 Hz")
    assert "pip install librosa" in message and "pip install espnet==202611" in message and "\n" not in message


@pytest.mark.skipif(not HAS_LIBROSA, reason="librosa is not installed")
def test_resampling_with_librosa():
    audio = prepare_one((8000, np.sin(np.arange(800) / 5).astype(np.float32)), sample_rate=16000)
    assert audio.rate == 16000 and audio.array.shape == (1600,) and audio.array.dtype == np.float32


def test_outputs_bare_arrays_take_the_rate_and_nan_is_refused():
    contract, model = audio_contract(model_rate=16000)
    out = C.validate_inference_outputs(
        {"wav": np.zeros((3, 100), dtype=np.int16)}, 0, contract, model, {0: {}}, "utt_id"
    )
    assert out["wav"].rate == 16000 and out["wav"].array.shape == (3, 100)
    with pytest.raises(TypeError, match="output 'wav' of dataset index 0 is a bare array"):
        C.validate_inference_outputs(
            {"wav": np.zeros(3)}, 0, contract, SimpleNamespace(sample_rate=None), {0: {}}, "utt_id"
        )
    with pytest.raises(ValueError, match=r"^output 'wav' of dataset index 0: audio samples must be finite"):
        C.validate_inference_outputs({"wav": np.array([0.0, np.nan])}, 0, contract, model, {0: {}}, "utt_id")
    with pytest.raises(TypeError, match=r"output 'wav' of dataset index 0: audio must be an Audio"):
        C.validate_inference_outputs({"wav": [0.0, 1.0, 2.0]}, 0, contract, model, {0: {}}, "utt_id")


@needs_soundfile
def test_paths_are_read_with_soundfile(tmp_path):
    import soundfile

    samples = np.array([[0, 1000], [-1000, 2000], [3000, 0], [0, 0]], dtype=np.int16)
    soundfile.write(tmp_path / "a.wav", samples, 8000, subtype="PCM_16")
    for value in (tmp_path / "a.wav", str(tmp_path / "a.wav")):
        audio = prepare_one(value, sample_rate=8000)
        np.testing.assert_array_equal(audio.array, samples.T / 32768.0)
    with pytest.raises(ValueError, match="has sample rate 8000, expected 16000"):
        prepare_one(tmp_path / "a.wav", sample_rate=16000, rate_policy="reject")


def test_module_imports_and_runs_without_espnet3_torch_librosa_soundfile(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        for name in ("torch", "espnet3", "librosa", "soundfile"):
            sys.modules[name] = None  # import of it fails
        import numpy as np
        from espnet3_prefect.espnet3 import artifacts
        from espnet3_prefect.espnet3 import contract
        assert not contract.delegates()
        c = contract.load_inference_contract({{"inputs": {{"speech": {{"kind": "audio", "sample_rate": 8000}}}},
                                              "outputs": {{"text": {{"kind": "text", "normalize": "to_upper"}}}}}})
        batch = [{{"speech": (8000, np.zeros(3, np.int16))}}]
        prepared, original = contract.prepare_inference_inputs(batch, 0, c, None)
        assert prepared[0]["speech"].rate == 8000
        out = contract.validate_inference_outputs({{"text": "ok"}}, 0, c, None, original, "utt_id")
        assert out == {{"text": "OK", "utt_id": "0"}}, out
        path = artifacts.materialize_output_value("u.1", "post", np.zeros(2), {str(tmp_path)!r}, None)
        assert path.endswith("/post/u.1.npy"), path
        try:
            contract.prepare_inference_inputs([{{"speech": "x.wav"}}], 0, c, None)
        except ModuleNotFoundError as exc:
            assert "needs soundfile: pip install soundfile" in str(exc), exc
        else:
            raise AssertionError("no error")
        print("OK")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr


def test_audio_value_class():
    audio = C.Audio(np.zeros((4000, 2), dtype=np.int16), 8000)
    assert (audio.channels, audio.duration, audio.array.shape) == (2, 0.5, (2, 4000))
    assert audio.mono().array.shape == (4000,) and audio.multichannel() is audio
    assert C.Audio(np.zeros(3), 8000).multichannel().array.shape == (1, 3)
    with pytest.raises(TypeError):
        C.Audio(np.zeros(3, dtype=bool), 8000)
    with pytest.raises(ValueError):
        C.Audio(np.zeros((2, 2, 2)), 8000)
    with pytest.raises(ValueError):
        C.Audio(np.zeros(3), 0)


# ============================================================================= parity with ESPnet3


def upstream_audio_class():
    from espnet3.contract.kinds.audio import Audio

    return Audio


def assert_same(ours, theirs, where="value"):
    """Equal values: same types (Audio for Audio), same dict order, arrays equal bit for bit."""
    if C.is_audio(ours) or C.is_audio(theirs):
        assert isinstance(ours, C.Audio) and isinstance(theirs, upstream_audio_class()), where
        assert ours.rate == theirs.rate and type(ours.rate) is type(theirs.rate), where
        assert_same(ours.array, theirs.array, where + ".array")
    elif isinstance(ours, np.ndarray) or isinstance(theirs, np.ndarray):
        assert type(ours) is type(theirs), where
        assert (ours.dtype, ours.shape, ours.flags.c_contiguous) == (
            theirs.dtype,
            theirs.shape,
            theirs.flags.c_contiguous,
        ), where
        assert ours.tobytes() == theirs.tobytes(), where
    elif hasattr(ours, "detach"):  # a tensor passed through (an original sample)
        assert type(ours) is type(theirs), where
        assert_same(ours.numpy(), theirs.numpy(), where)
    elif isinstance(ours, dict):
        assert type(theirs) is dict and list(ours) == list(theirs), where
        for key in ours:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(ours, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def run_both(run):
    """``run(api)`` with our standalone functions and with ESPnet3's; (value or exception) each."""
    results = []
    for api in (C, UP):
        try:
            results.append(("ok", run(api)))
        except Exception as exc:  # noqa: BLE001 - compared below
            results.append(("error", exc))
    return results


def assert_parity(run):
    (ours_kind, ours), (their_kind, theirs) = run_both(run)
    if their_kind == "error":
        assert ours_kind == "error", f"ESPnet3 raised {theirs!r}, we returned {ours!r}"
        assert isinstance(ours, type(theirs)), f"we raised {ours!r}, ESPnet3 {theirs!r}"
        assert "\n" not in str(ours)
        return None
    assert ours_kind == "ok", f"we raised {ours!r}, ESPnet3 returned {theirs!r}"
    assert_same(ours, theirs)
    return ours


def pipeline(contract_config, dataset, idx, result, model=None, idx_key="utt_id", input_key=None):
    """load, validate_input_keys, prepare, validate outputs: the path InferenceRunner.forward takes."""

    def run(api):
        contract = api.load_inference_contract(contract_config)
        contract.validate_input_keys(input_key or [f for f in contract_config["inputs"]])
        prepared, original = api.prepare_inference_inputs(dataset, idx, contract, model)
        outputs = api.validate_inference_outputs(
            result(prepared) if callable(result) else result, idx, contract, model, original, idx_key
        )
        return prepared, original, outputs

    return run


TEXTS = ["  Hello World  ", "MiXeD case\ttab", "ünïcödé ÄÖ 漢字", "", " \n x \n", "ß straße İ"]


@parity
@pytest.mark.parametrize("normalize", [None, [], "strip", ["strip", "to_lower"], ["to_upper", "strip"], ["to_lower"]])
def test_parity_text(normalize):
    options = {} if normalize is None else {"normalize": normalize}
    config = {"inputs": {"text": {"kind": "text", **options}}, "outputs": {"hyp": {"kind": "text", **options}}}
    dataset = [{"text": t, "utt_id": f"u{i}"} for i, t in enumerate(TEXTS)]
    indices = list(range(len(TEXTS)))
    echo = lambda prepared: {"hyp": [prepared[i]["text"] + " END " for i in indices]}  # noqa: E731
    assert_parity(pipeline(config, dataset, indices, echo))
    for i in indices:
        assert_parity(pipeline(config, dataset, i, {"hyp": TEXTS[i]}))


@parity
@pytest.mark.parametrize(
    "value",
    [
        0,
        -3,
        2.5,
        float("inf"),
        np.float32(0.1),
        np.float64(1e-300),
        np.int64(-9),
        np.uint8(200),
        True,
        np.bool_(True),
        "1",
        None,
        [1],
        1 + 0j,
    ],
)
def test_parity_number(value):
    config = {"inputs": {"x": {"kind": "text"}}, "outputs": {"score": {"kind": "number"}}}
    assert_parity(pipeline(config, [{"x": "a"}], 0, {"score": value}))


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "int16_mono": rng.integers(-32768, 32767, 50, dtype=np.int16),
        "int16_stereo_frames_first": rng.integers(-32768, 32767, (50, 2), dtype=np.int16),
        "int32_stereo_channels_first": rng.integers(-(2**31), 2**31 - 1, (2, 50), dtype=np.int32),
        "uint8_mono": rng.integers(0, 255, 50, dtype=np.uint8),
        "float32_mono": rng.standard_normal(50).astype(np.float32),
        "float32_stereo_frames_first": rng.standard_normal((50, 2)).astype(np.float32),
        "float64_4ch": rng.standard_normal((4, 50)),
        "float32_one_channel_2d": rng.standard_normal((1, 50)).astype(np.float32),
        "two_frames_stereo": np.ones((2, 2), dtype=np.float32),
        "two_frames_mono": np.ones((2, 1), dtype=np.float32),
        "three_by_two": np.arange(6, dtype=np.int16).reshape(3, 2),
        "loud_float": np.array([3.5, -7.25], dtype=np.float64),
        "nan": np.array([0.0, np.nan]),
        "bool": np.array([True, False]),
        "3d": np.zeros((2, 2, 2), dtype=np.float32),
        "scalar": np.array(0.5, dtype=np.float32),
        "empty": np.zeros(0, dtype=np.float32),
    }


def _audio_values():
    values = dict(_arrays())
    for name, array in _arrays().items():
        values[f"pair:{name}"] = (16000, array)
        values[f"list_pair_np_rate:{name}"] = [np.int32(16000), array]
    values["pair_of_other_rate_equal"] = (16000, np.zeros(10, dtype=np.int16))
    values["list_of_floats"] = [0.1, 0.2, 0.3]
    values["string_rate_pair"] = ("16000", np.zeros(3))
    return values


AUDIO_VALUES = _audio_values()


@parity
@pytest.mark.parametrize(
    "options",
    [
        {"sample_rate": 16000},
        {"sample_rate": 16000, "rate_policy": "reject"},
        {"sample_rate": 16000, "channels": 1},
        {"sample_rate": 16000, "channels": 2},
        {"sample_rate": 16000, "normalize": ["first_channel"], "channels": 1},
        {"sample_rate": 16000, "normalize": "mean_channels"},
        {"normalize": ["mean_channels", "first_channel"]},
        {},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "no-options",
)
@pytest.mark.parametrize("name", sorted(AUDIO_VALUES))
def test_parity_audio_inputs_and_outputs(options, name):
    value = AUDIO_VALUES[name]
    config = {"inputs": {"speech": {"kind": "audio", **options}}, "outputs": {"wav": {"kind": "audio", **options}}}
    for model in (None, SimpleNamespace(sample_rate=16000)):
        assert_parity(pipeline(config, [{"speech": value, "utt_id": "u.1"}], 0, {"wav": value}, model=model))
        assert_parity(pipeline(config, [{"speech": value}] * 2, [0, 1], {"wav": [value, value]}, model=model))


@parity
@pytest.mark.parametrize("dtype", ["int16", "float32"])
@pytest.mark.parametrize("layout", ["mono", "stereo_frames_first", "stereo_channels_first"])
def test_parity_audio_tensors(dtype, layout):
    torch = pytest.importorskip("torch")
    shape = {"mono": (40,), "stereo_frames_first": (40, 2), "stereo_channels_first": (2, 40)}[layout]
    tensor = (torch.randn(shape) * 10000).to(getattr(torch, dtype))
    for options in ({"sample_rate": 16000}, {"sample_rate": 16000, "normalize": "mean_channels"}):
        config = {"inputs": {"speech": {"kind": "audio", **options}}, "outputs": {"wav": {"kind": "audio", **options}}}
        assert_parity(pipeline(config, [{"speech": tensor}], 0, {"wav": tensor}))
        assert_parity(pipeline(config, [{"speech": (16000, tensor)}], 0, {"wav": (16000, tensor)}))


@parity
def test_parity_audio_objects_each_side_its_own_class():
    UpAudio = upstream_audio_class()
    array = np.arange(-50, 50, dtype=np.int16).reshape(50, 2)
    config = {
        "inputs": {"speech": {"kind": "audio", "sample_rate": 16000}},
        "outputs": {"wav": {"kind": "audio", "normalize": "first_channel"}},
    }

    def run(api):
        audio = (C.Audio if api is C else UpAudio)(array, 16000)
        return pipeline(config, [{"speech": audio}], [0], {"wav": [audio]})(api)

    assert_parity(run)


@parity
@needs_soundfile
@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "FLOAT", "PCM_U8"])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_parity_audio_files(tmp_path, subtype, channels):
    import soundfile

    rng = np.random.default_rng(channels)
    path = tmp_path / f"a.{subtype}.wav"
    soundfile.write(path, rng.uniform(-1, 1, (300, channels)), 16000, subtype=subtype)
    for options in (
        {"sample_rate": 16000},
        {"sample_rate": 16000, "rate_policy": "reject"},
        {"normalize": "first_channel"},
        {},
    ):
        config = {"inputs": {"speech": {"kind": "audio", **options}}, "outputs": {"wav": {"kind": "audio", **options}}}
        for value in (path, str(path)):
            assert_parity(pipeline(config, [{"speech": value}], 0, {"wav": value}))
    config = {
        "inputs": {"speech": {"kind": "audio", "sample_rate": 8000, "rate_policy": "reject"}},
        "outputs": {"wav": {"kind": "text"}},
    }
    assert_parity(pipeline(config, [{"speech": path}], 0, {"wav": "x"}))  # both refuse the 16 kHz file


@parity
@pytest.mark.skipif(not HAS_LIBROSA, reason="librosa is not installed: resampling is compared where it is")
@pytest.mark.parametrize("source_rate", [8000, 22050, 44100])
def test_parity_resampling(source_rate):
    rng = np.random.default_rng(source_rate)
    config = {
        "inputs": {"speech": {"kind": "audio", "sample_rate": 16000}},
        "outputs": {"wav": {"kind": "audio", "normalize": "mean_channels"}},
    }
    for array in (rng.uniform(-1, 1, 700).astype(np.float32), rng.integers(-3000, 3000, (700, 2), dtype=np.int16)):
        assert_parity(
            pipeline(
                config,
                [{"speech": (source_rate, array)}],
                0,
                {"wav": (source_rate, array)},
                model=SimpleNamespace(sample_rate=16000),
            )
        )


@parity
def test_parity_resampling_without_librosa_raises_the_same_type(monkeypatch):
    monkeypatch.setitem(sys.modules, "librosa", None)
    config = {"inputs": {"speech": {"kind": "audio", "sample_rate": 16000}}, "outputs": {"t": {"kind": "text"}}}
    assert_parity(pipeline(config, [{"speech": (8000, np.zeros(5))}], 0, {"t": "x"}))


@parity
@pytest.mark.parametrize(
    "case",
    [
        "split",
        "list",
        "one_in_batch",
        "list_for_single",
        "count",
        "extra",
        "missing",
        "not_mapping",
        "tuple_result",
        "reserved",
        "idx_from_result",
        "empty_batch_mapping",
        "optional_dropped",
        "optional_none",
        "required_missing",
        "sample_not_mapping",
        "idx_key_other",
        "int_ids",
    ],
)
def test_parity_outputs_and_inputs(case):
    io = {
        "inputs": {"text": {"kind": "text"}, "prompt": {"kind": "text", "optional": True}},
        "outputs": {"hyp": {"kind": "text", "normalize": "strip"}, "n": {"kind": "number"}},
    }
    data = [{"text": "a", "utt_id": "x"}, {"text": "b", "prompt": "p"}, {"text": "c", "prompt": None, "utt_id": 7}]
    cases = {
        "split": (data, [0, 1, 2], {"n": [1, 2, 3], "hyp": [" a ", "b ", " c"]}),
        "list": (data, [2, 0], [{"hyp": "1", "n": 1}, {"n": 2.0, "hyp": "2", "utt_id": "given"}]),
        "one_in_batch": (data, [1], {"hyp": "h", "n": 1}),
        "list_for_single": (data, 1, [{"hyp": "h", "n": 1}]),
        "count": (data, [0, 1], [{"hyp": "h", "n": 1}]),
        "extra": (data, 0, {"hyp": "h", "n": 1, "score": 2}),
        "missing": (data, 0, {"hyp": "h"}),
        "not_mapping": (data, 0, "h"),
        "tuple_result": (data, [0, 1], ({"hyp": "h", "n": 1}, {"hyp": "h", "n": 1})),
        "reserved": (data, 0, {"hyp": "h", "n": 1}),
        "idx_from_result": (data, [0, 2], {"hyp": ["a", "b"], "n": [1, 2], "utt_id": ["r0", "r2"]}),
        "empty_batch_mapping": (data, [0, 1], {}),
        "optional_dropped": (data, [0, 1, 2], [{"hyp": "h", "n": 1}] * 3),
        "optional_none": (data, 2, {"hyp": "h", "n": 1}),
        "required_missing": ([{"prompt": "p"}], 0, {"hyp": "h", "n": 1}),
        "sample_not_mapping": (["text"], 0, {"hyp": "h", "n": 1}),
        "idx_key_other": (data, [0, 1], {"hyp": ["a", "b"], "n": [1, 2]}),
        "int_ids": (data, 2, {"hyp": "h", "n": 1}),
    }
    dataset, idx, result = cases[case]
    idx_key = {"reserved": "hyp", "idx_key_other": "key"}.get(case, "utt_id")
    assert_parity(pipeline(io, dataset, idx, result, idx_key=idx_key, input_key=["text", "prompt"]))


BAD_CONFIGS = {
    "unknown_top": {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}, "extra": 1},
    "no_inputs": {"outputs": {"y": {"kind": "text"}}},
    "empty_outputs": {"inputs": {"x": {"kind": "text"}}, "outputs": {}},
    "list_inputs": {"inputs": [{"x": {"kind": "text"}}], "outputs": {"y": {"kind": "text"}}},
    "decl_not_mapping": {"inputs": {"x": "text"}, "outputs": {"y": {"kind": "text"}}},
    "no_kind": {"inputs": {"x": {}}, "outputs": {"y": {"kind": "text"}}},
    "unknown_kind": {"inputs": {"x": {"kind": "video"}}, "outputs": {"y": {"kind": "text"}}},
    "unknown_option": {"inputs": {"x": {"kind": "text", "lang": "en"}}, "outputs": {"y": {"kind": "text"}}},
    "name_option": {"inputs": {"x": {"kind": "text", "name": "z"}}, "outputs": {"y": {"kind": "text"}}},
    "unknown_normalizer": {
        "inputs": {"x": {"kind": "text", "normalize": ["nfkc"]}},
        "outputs": {"y": {"kind": "text"}},
    },
    "audio_normalizer_on_text": {
        "inputs": {"x": {"kind": "text", "normalize": "first_channel"}},
        "outputs": {"y": {"kind": "text"}},
    },
    "normalize_not_names": {"inputs": {"x": {"kind": "text", "normalize": [1]}}, "outputs": {"y": {"kind": "text"}}},
    "normalize_mapping": {"inputs": {"x": {"kind": "text", "normalize": {"a": 1}}}, "outputs": {"y": {"kind": "text"}}},
    "rate_zero": {"inputs": {"x": {"kind": "audio", "sample_rate": 0}}, "outputs": {"y": {"kind": "text"}}},
    "rate_bool": {"inputs": {"x": {"kind": "audio", "sample_rate": True}}, "outputs": {"y": {"kind": "text"}}},
    "rate_float": {"inputs": {"x": {"kind": "audio", "sample_rate": 16000.0}}, "outputs": {"y": {"kind": "text"}}},
    "policy": {"inputs": {"x": {"kind": "audio", "rate_policy": "keep"}}, "outputs": {"y": {"kind": "text"}}},
    "bad_name": {"inputs": {"my-x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
    "int_name": {"inputs": {1: {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
    "channels_zero": {"inputs": {"x": {"kind": "audio", "channels": 0}}, "outputs": {"y": {"kind": "text"}}},
    "channels_str": {"inputs": {"x": {"kind": "audio", "channels": "2"}}, "outputs": {"y": {"kind": "text"}}},
    "optional_output": {"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text", "optional": True}}},
    "imports_str": {"imports": "m", "inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
    "imports_empty_name": {"imports": [""], "inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}},
    "not_mapping": ["inputs"],
}


@parity
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_parity_config_errors_have_espnet3s_exception_types(name):
    def run(api):
        return api.load_inference_contract(BAD_CONFIGS[name])

    (ours_kind, ours), (their_kind, theirs) = run_both(run)
    assert their_kind == ours_kind == "error", (ours, theirs)
    assert isinstance(ours, type(theirs)) and isinstance(ours, ConfigError), (ours, theirs)
    assert "\n" not in str(ours)


@parity
def test_parity_good_configs_declare_the_same_fields():
    config = {
        "imports": [],
        "inputs": {
            "speech": {
                "kind": "audio",
                "sample_rate": 16000,
                "rate_policy": "reject",
                "channels": 1,
                "label": "Input audio",
                "normalize": "first_channel",
            },
            "prompt_text": {"kind": "text", "optional": True},
        },
        "outputs": {"text": {"kind": "text", "normalize": ["strip", "to_lower"]}, "n": {"kind": "number"}},
    }
    ours, theirs = C.load_inference_contract(config), UP.load_inference_contract(config)
    assert ours.imports == theirs.imports
    for a, b in zip(ours.inputs + ours.outputs, theirs.inputs + theirs.outputs, strict=True):
        assert (a.name, a.kind, a.label, a.optional, a.channels, dict(a.options)) == (
            b.name,
            b.kind,
            b.label,
            b.optional,
            b.channels,
            dict(b.options),
        )


@parity
def test_with_espnet3_importable_every_function_is_espnet3s(monkeypatch):
    monkeypatch.setattr(C, "STANDALONE", False)
    assert C.delegates() and C.upstream_module() is UP
    config = {
        "inputs": {"speech": {"kind": "audio", "sample_rate": 8000}},
        "outputs": {"seg": {"kind": "segments"}, "wav": {"kind": "audio"}},
    }
    contract = C.load_inference_contract(config)
    assert isinstance(contract, UP.InferenceContract)
    assert isinstance(C.resolve_inference_contract(config), UP.InferenceContract)
    assert C.resolve_inference_contract(contract) is contract
    # our Audio, in a dataset or in a result, is handed to ESPnet3 as its own Audio
    ours = C.Audio(np.arange(6, dtype=np.int16).reshape(3, 2), 8000)
    prepared, original = C.prepare_inference_inputs([{"speech": ours}], [0], contract, None)
    assert isinstance(prepared[0]["speech"], upstream_audio_class())
    out = C.validate_inference_outputs(
        {"seg": [[{"text": "a", "start": 0, "end": 1}]], "wav": [ours]},
        [0],
        contract,
        SimpleNamespace(sample_rate=8000),
        original,
        "utt_id",
    )
    assert isinstance(out[0]["wav"], upstream_audio_class()) and out[0]["utt_id"] == "0"
    np.testing.assert_array_equal(out[0]["wav"].array, ours.array)
    # a standalone contract stays ours even then
    with C.standalone():
        mine = C.load_inference_contract({"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}}})
    assert C.resolve_inference_contract(mine) is mine
    assert C.validate_inference_outputs({"y": "a"}, 0, mine, None, {0: {}}, "utt_id") == {"y": "a", "utt_id": "0"}


def test_contracts_and_audio_survive_pickling_for_workers():
    import pickle

    contract = load(
        {"speech": {"kind": "audio", "sample_rate": 8000, "normalize": "first_channel"}},
        {"text": {"kind": "text", "normalize": ["strip"]}},
    )
    again = pickle.loads(pickle.dumps(contract))
    assert again == contract
    audio = pickle.loads(pickle.dumps(C.Audio(np.zeros((2, 5), np.int16), 8000)))
    assert audio.rate == 8000 and audio.array.shape == (2, 5) and audio.array.dtype == np.float32
    prepared, _ = C.prepare_inference_inputs([{"speech": (8000, np.ones((5, 2)))}], 0, again, None)
    assert prepared[0]["speech"].array.shape == (5,)


def test_standalone_switch_restores_the_flag(monkeypatch):
    monkeypatch.setattr(C, "STANDALONE", False)
    with C.standalone():
        assert C.STANDALONE and not C.delegates()
    assert C.STANDALONE is False
    assert issubclass(C.ContractTypeError, TypeError) and issubclass(C.ContractTypeError, ConfigError)


@pytest.mark.parametrize("forced", [True, False], ids=["standalone", "as-installed"])
@pytest.mark.parametrize("module", ["espnet3_prefect.espnet3.contract", "espnet3_prefect.espnet3.artifacts"])
def test_docstring_examples_run(module, forced, monkeypatch):
    """The modules' examples hold standalone and delegated to espnet3 (where it is importable)."""
    import doctest

    monkeypatch.setattr(C, "STANDALONE", forced)
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 10
