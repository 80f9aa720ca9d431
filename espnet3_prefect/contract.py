"""ESPnet3 202611's inference ``contract:`` block, with or without espnet3 installed.

An ESPnet3 ``inference.yaml`` may declare what its model takes and what it returns::

    input_key: speech
    contract:
      inputs:
        speech: {kind: audio, sample_rate: 16000, rate_policy: resample}
      outputs:
        text: {kind: text, normalize: [strip, to_lower]}

Before the model runs, each declared input of a dataset item is checked and converted by its
kind; afterwards each declared output is checked and normalized, undeclared outputs are refused,
and the utterance id is attached under ``idx_key``.

**With espnet3 importable** (PyPI ``espnet==202611``), every public function here hands the work to
``espnet3.contract.inference`` and returns its objects, so the behaviour is ESPnet3's own.

**Without it**, this module implements the common subset itself, with the same values, the same
exception types and one-line messages that name the field:

==========  ====================================================  ==============================
kind        options (besides ``label``, ``optional``)              normalizers
==========  ====================================================  ==============================
``text``    ``normalize``                                          ``strip``, ``to_lower``,
                                                                   ``to_upper``
``number``  ``normalize``                                          (none)
``audio``   ``normalize``, ``sample_rate``, ``rate_policy``        ``first_channel``,
            (``resample``/``reject``), ``channels``                ``mean_channels``
==========  ====================================================  ==============================

What needs ESPnet3's registries (kind ``segments``, ``contract.imports``, custom kinds and
normalizers) is a :class:`~espnet3_prefect.errors.ConfigError` naming the key, never ignored.
Resampling needs ``librosa`` (as in ESPnet3); reading audio files needs ``soundfile``.

``STANDALONE = True`` (or ``with standalone():``) makes this module, and
:mod:`espnet3_prefect.artifacts`, use their own implementation even where espnet3 is importable.

Examples:
    >>> contract = load_inference_contract({
    ...     "inputs": {"text": {"kind": "text"}},
    ...     "outputs": {"hyp": {"kind": "text", "normalize": ["strip", "to_lower"]}},
    ... })
    >>> contract.validate_input_keys("text")
    >>> prepared, original = prepare_inference_inputs([{"text": "Hi", "utt_id": "a"}], [0], contract, None)
    >>> prepared
    {0: {'text': 'Hi', 'utt_id': 'a'}}
    >>> validate_inference_outputs({"hyp": [" HELLO "]}, [0], contract, None, original, "utt_id")
    [{'hyp': 'hello', 'utt_id': 'a'}]
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import numbers
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from .errors import ConfigError, one_line

ESPNET3_VERSION = "202611"
INSTALL_ESPNET3 = f"pip install espnet=={ESPNET3_VERSION}"

#: True: never hand work to espnet3, even where it is importable (this module and ``artifacts``).
STANDALONE = False

# Keys of one field declaration that describe the field itself; every other key is a kind option.
FIELD_KEYS = ("kind", "label", "optional", "channels")
# Kinds ESPnet3 202611 has built in that only it implements.
NEEDS_ESPNET3_KINDS = ("segments",)
_TOP_KEYS = ("imports", "inputs", "outputs")


class ContractTypeError(ConfigError, TypeError):
    """A ``contract:`` entry has the wrong type (where ESPnet3 raises ``TypeError``)."""


# --------------------------------------------------------------------------- delegation


@functools.lru_cache(maxsize=None)
def _find_upstream():
    try:
        if importlib.util.find_spec("espnet3.contract") is None:
            return None
    except (ImportError, ValueError):
        return None
    return importlib.import_module("espnet3.contract.inference")


def upstream_module():
    """Return ``espnet3.contract.inference`` when work is handed to it, else None.

    None when espnet3 is not importable or :data:`STANDALONE` is set.

    Examples:
        >>> with standalone():
        ...     upstream_module() is None
        True
    """
    return None if STANDALONE else _find_upstream()


def delegates() -> bool:
    """Tell whether the public functions of this module run ESPnet3's own code.

    Examples:
        >>> with standalone():
        ...     delegates()
        False
    """
    return upstream_module() is not None


@contextlib.contextmanager
def standalone(enabled: bool = True) -> Iterator[None]:
    """Use (or, with ``enabled=False``, do not force) the standalone implementation in a block.

    Not thread-safe: it flips the module flag :data:`STANDALONE`.

    Examples:
        >>> with standalone():
        ...     load_inference_contract({"inputs": {"x": {"kind": "text"}},
        ...                              "outputs": {"seg": {"kind": "segments"}}})
        Traceback (most recent call last):
        espnet3_prefect.errors.ConfigError: contract.outputs.seg.kind: 'segments' needs espnet3 installed (pip install espnet==202611)
    """
    global STANDALONE
    saved, STANDALONE = STANDALONE, enabled
    try:
        yield
    finally:
        STANDALONE = saved


def _upstream_audio_class():
    """ESPnet3's ``Audio`` if its module is already loaded (never imports it)."""
    module = sys.modules.get("espnet3.contract.kinds.audio")
    return getattr(module, "Audio", None)


def is_audio(value: Any) -> bool:
    """Tell whether ``value`` is an :class:`Audio`, ours or ESPnet3's.

    Examples:
        >>> is_audio(Audio(np.zeros(4, dtype=np.float32), 8000)), is_audio(np.zeros(4))
        (True, False)
    """
    if isinstance(value, Audio):
        return True
    upstream = _upstream_audio_class()
    return upstream is not None and isinstance(value, upstream)


# --------------------------------------------------------------------------- audio values


def _to_float32_samples(samples: Any) -> np.ndarray:
    """Samples as float32: integer PCM scaled to [-1, 1) by its midpoint, floats kept."""
    samples = np.asarray(samples)
    dtype = samples.dtype
    if np.issubdtype(dtype, np.unsignedinteger):
        # unsigned PCM (8-bit WAV) is centred on its midpoint, not on zero
        centre = (np.iinfo(dtype).max + 1) / 2
        samples = (samples.astype(np.float64) - centre) / centre
    elif np.issubdtype(dtype, np.integer):
        # signed PCM: the most negative value maps to -1 (int16 divides by 32768)
        samples = samples / float(-np.iinfo(dtype).min)
    elif not np.issubdtype(dtype, np.floating):
        raise TypeError(f"audio samples must be integer or floating point numbers, got dtype {dtype}")
    with np.errstate(over="ignore", invalid="ignore"):
        return samples.astype(np.float32, copy=False)


@dataclass(frozen=True, eq=False)
class Audio:
    """A float32 waveform and its sample rate: ESPnet3's ``Audio`` without espnet3.

    ``array`` is 1-D for mono and ``(channels, samples)`` otherwise. A 2-D input is laid out with
    the shorter axis as channels (``(samples, channels)`` from soundfile is transposed), except
    that a one- or two-frame array keeps its layout; one channel becomes 1-D. Integer PCM is
    scaled by its midpoint (int16 / 32768, uint8 centred on 128); floats are kept as they are.

    Raises:
        TypeError: the samples are not integers or floats.
        ValueError: a sample is NaN or infinite, the array is not 1-D or 2-D, or ``rate <= 0``.

    Examples:
        >>> stereo = Audio(np.array([[0, 16384], [-32768, 0], [0, 0]], dtype=np.int16), 8000)
        >>> stereo.array
        array([[ 0. , -1. ,  0. ],
               [ 0.5,  0. ,  0. ]], dtype=float32)
        >>> stereo.channels, stereo.rate, stereo.mono().array
        (2, 8000, array([ 0., -1.,  0.], dtype=float32))
    """

    array: np.ndarray
    rate: int

    def __post_init__(self) -> None:
        samples = _to_float32_samples(self.array)
        if not np.isfinite(samples).all():
            raise ValueError("audio samples must be finite, found NaN or Inf")
        if samples.ndim == 2:
            frames_first = samples.shape[0] > samples.shape[1] and samples.shape[0] > 2
            if frames_first:
                samples = samples.T
            if samples.shape[0] == 1:
                samples = samples[0]
        if samples.ndim not in (1, 2):
            raise ValueError(f"audio must be 1-D (mono) or 2-D (channels, samples), got shape {samples.shape}")
        object.__setattr__(self, "array", np.ascontiguousarray(samples))
        object.__setattr__(self, "rate", int(self.rate))
        if self.rate <= 0:
            raise ValueError(f"audio sample rate must be positive, got {self.rate}")

    @property
    def channels(self) -> int:
        """The number of channels (1 for a 1-D array)."""
        return 1 if self.array.ndim == 1 else self.array.shape[0]

    @property
    def duration(self) -> float:
        """Seconds of audio.

        Examples:
            >>> Audio(np.zeros(4000, dtype=np.float32), 8000).duration
            0.5
        """
        return self.array.shape[-1] / self.rate

    def mono(self, channel: int = 0) -> "Audio":
        """One channel (the first by default) as 1-D audio; ``self`` when already mono."""
        if self.array.ndim == 1:
            return self
        return Audio(self.array[channel], self.rate)

    def multichannel(self) -> "Audio":
        """This audio as ``(channels, samples)``: mono becomes ``(1, samples)``."""
        if self.array.ndim == 2:
            return self
        out = Audio.__new__(Audio)
        object.__setattr__(out, "array", self.array[None, :])
        object.__setattr__(out, "rate", self.rate)
        return out

    @classmethod
    def read(cls, path: str | Path, rate: int | None = None) -> "Audio":
        """Read an audio file with soundfile (every channel), resampled to ``rate`` when given."""
        try:
            import soundfile
        except ImportError:
            raise ModuleNotFoundError(
                f"reading audio file {str(path)!r} needs soundfile: pip install soundfile",
                name="soundfile") from None
        samples, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        audio = cls(samples, file_rate)
        return audio if rate is None else audio.resample(rate)

    def resample(self, rate: int) -> "Audio":
        """This audio at ``rate`` (librosa's default resampler, as ESPnet3); ``self`` if already there."""
        if rate == self.rate:
            return self
        try:
            import librosa
        except ImportError:
            raise ModuleNotFoundError(
                f"audio at {self.rate} Hz must be resampled to {rate} Hz, which needs librosa: "
                f"pip install librosa (or {INSTALL_ESPNET3}, which brings it), or give audio at {rate} Hz",
                name="librosa") from None
        return Audio(librosa.resample(self.array, orig_sr=self.rate, target_sr=rate, axis=-1), rate)

    @classmethod
    def coerce(cls, value: Any, rate: Optional[int]) -> "Audio":
        """Make an :class:`Audio` at ``rate`` (``None``: its own rate) from what a caller holds.

        Accepted: an ``Audio`` (ours or ESPnet3's), a file path (read with soundfile), a
        ``(rate, samples)`` pair, or a bare NumPy array / torch tensor taken to be at ``rate``
        (refused when ``rate`` is None: a bare array carries no rate).

        Examples:
            >>> Audio.coerce((8000, np.zeros(3, dtype=np.int16)), 8000).array
            array([0., 0., 0.], dtype=float32)
            >>> Audio.coerce(np.zeros(3), None)
            Traceback (most recent call last):
            TypeError: cannot tell the sample rate of a bare audio array: set the field's sample_rate (or model.sample_rate), or pass an Audio, a (rate, samples) pair or a file path
        """
        if not isinstance(value, Audio) and is_audio(value):
            value = Audio(value.array, value.rate)  # ESPnet3's Audio: same samples, our class
        if isinstance(value, Audio):
            # frozen, but its buffer may have been written to since construction
            if not np.isfinite(value.array).all():
                raise ValueError("audio samples must be finite, found NaN or Inf")
            return value if rate is None else value.resample(rate)
        if isinstance(value, (str, Path)):
            return cls.read(value, rate)
        if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (int, np.integer)):
            audio = cls(np.asarray(value[1]), int(value[0]))
            return audio if rate is None else audio.resample(rate)
        if hasattr(value, "detach"):  # a torch tensor (torch is never imported here)
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            if rate is None:
                raise TypeError(
                    "cannot tell the sample rate of a bare audio array: set the field's sample_rate "
                    "(or model.sample_rate), or pass an Audio, a (rate, samples) pair or a file path")
            return cls(value, rate)
        raise TypeError(
            "audio must be an Audio, a file path, a (rate, samples) pair, a NumPy array or a "
            f"tensor, got {type(value).__name__}")


# --------------------------------------------------------------------------- kinds


def _normalizer_names(options: Mapping[str, Any]) -> list:
    names = options.get("normalize", ()) or ()
    return [names] if isinstance(names, str) else names


class _Kind:
    """One kind of the standalone subset: option check, value check, normalizers."""

    name = ""
    option_names = frozenset({"normalize"})
    normalizers: dict = {}

    def validate_options(self, options: Mapping[str, Any], where: str) -> None:
        unknown = set(options) - self.option_names
        if unknown:
            allowed = sorted(self.option_names | set(FIELD_KEYS))
            raise ConfigError(one_line(
                f"{where}: unknown option(s) {sorted(unknown, key=str)} for kind {self.name!r}; "
                f"allowed: {', '.join(allowed)}"))
        names = _normalizer_names(options)
        if not isinstance(names, (list, tuple)) or any(not isinstance(n, str) for n in names):
            raise ContractTypeError(one_line(
                f"{where}.normalize must be a normalizer name or a list of names, got {names!r}"))
        unknown = set(names) - set(self.normalizers)
        if unknown:
            known = ", ".join(self.normalizers) or "none"
            raise ConfigError(one_line(
                f"{where}.normalize: unknown normalizer(s) {sorted(unknown)} for kind {self.name!r} "
                f"(built in: {known}); custom normalizers (contract.imports + register_normalizer) "
                f"need espnet3 installed ({INSTALL_ESPNET3})"))

    def check(self, value, field, model, *, output, where):  # pragma: no cover - abstract
        raise NotImplementedError

    def check_configured(self, value, field, model, options, *, output, where):
        return self.check(value, field, model, output=output, where=where)

    def apply(self, value, field, model, options, *, output, where):
        """Check, run the field's normalizers, and check again (channels only then)."""
        names = _normalizer_names(options)
        first = replace(field, channels=None) if names else field
        result = self.check_configured(value, first, model, options, output=output, where=where)
        for name in names:
            result = self.normalizers[name](result)
        if names:
            result = self.check_configured(result, field, model, options, output=output, where=where)
        return result

    def to_model_input(self, value, field):
        return value


class _TextKind(_Kind):
    name = "text"
    normalizers = {"strip": str.strip, "to_lower": str.lower, "to_upper": str.upper}

    def check(self, value, field, model, *, output, where):
        if not isinstance(value, str):
            raise TypeError(f"{where} must be a str, got {type(value).__name__}")
        return value


class _NumberKind(_Kind):
    name = "number"

    def check(self, value, field, model, *, output, where):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where} must be a real number (not bool), got {type(value).__name__}")
        return value


def _mean_channels(audio: Audio) -> Audio:
    return Audio(audio.array.mean(axis=0) if audio.array.ndim == 2 else audio.array, audio.rate)


class _AudioKind(_Kind):
    name = "audio"
    option_names = _Kind.option_names | {"sample_rate", "rate_policy"}
    normalizers = {"first_channel": Audio.mono, "mean_channels": _mean_channels}

    def validate_options(self, options, where):
        super().validate_options(options, where)
        rate = options.get("sample_rate")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0):
            raise ConfigError(f"{where}.sample_rate must be an integer > 0, got {rate!r}")
        policy = options.get("rate_policy", "resample")
        if policy not in ("resample", "reject"):
            raise ConfigError(f"{where}.rate_policy must be 'resample' or 'reject', got {policy!r}")

    def check_configured(self, value, field, model, options, *, output, where):
        rate = options.get("sample_rate")
        if rate is None:
            rate = getattr(model, "sample_rate", None)
        try:
            if options.get("rate_policy", "resample") == "reject":
                carried = None
                if is_audio(value):
                    carried = value.rate
                elif isinstance(value, (str, Path)):
                    value = Audio.read(value)
                    carried = value.rate
                elif isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (int, np.integer)):
                    carried = value[0]
                if carried is not None and rate is not None and carried != rate:
                    raise ValueError(
                        f"{where} has sample rate {carried}, expected {rate} (rate_policy: reject; "
                        "use rate_policy: resample to convert it)")
            return self.check(value, field, SimpleNamespace(sample_rate=rate), output=output, where=where)
        except ModuleNotFoundError as exc:
            if exc.name in ("librosa", "soundfile") and not str(exc).startswith(where):
                raise ModuleNotFoundError(one_line(f"{where}: {exc}"), name=exc.name) from None
            raise
        except (TypeError, ValueError) as exc:
            if type(exc) in (TypeError, ValueError) and not str(exc).startswith(where):
                raise type(exc)(one_line(f"{where}: {exc}")) from exc
            raise

    def check(self, value, field, model, *, output, where):
        rate = model.sample_rate
        if output and isinstance(value, np.ndarray):
            if rate is None:
                raise TypeError(
                    f"{where} is a bare array but no sample rate is fixed (no sample_rate option, "
                    "no model.sample_rate): return an Audio or a (rate, samples) pair")
            audio = Audio(value, rate)
        else:
            audio = Audio.coerce(value, rate)
        want = field.channels
        if want is not None and audio.channels != want:
            raise TypeError(f"{where} has {audio.channels} channel(s), contract wants channels: {want}")
        return audio


_KINDS: dict[str, _Kind] = {"audio": _AudioKind(), "number": _NumberKind(), "text": _TextKind()}
#: Kinds the standalone implementation supports, and their built-in normalizers.
SUPPORTED_KINDS = {name: tuple(kind.normalizers) for name, kind in sorted(_KINDS.items())}


# --------------------------------------------------------------------------- declarations


def _check_declaration(name: Any, kind: Any, channels: Any, options: Any, where: str) -> None:
    if not isinstance(kind, str) or kind not in _KINDS:
        if kind in NEEDS_ESPNET3_KINDS:
            raise ConfigError(f"{where}.kind: {kind!r} needs espnet3 installed ({INSTALL_ESPNET3})")
        if kind is None:
            raise ConfigError(f"{where}.kind is missing; one of {sorted(_KINDS)}")
        raise ConfigError(one_line(
            f"{where}.kind: unknown kind {kind!r}; built in: {sorted(_KINDS)} "
            f"({', '.join(NEEDS_ESPNET3_KINDS)} and custom kinds from contract.imports need espnet3 "
            f"installed: {INSTALL_ESPNET3})"))
    if not isinstance(options, Mapping):
        raise ContractTypeError(f"{where}: kind options must be a mapping, got {type(options).__name__}")
    _KINDS[kind].validate_options(options, where)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"{where}: field name {name!r} must be a Python identifier")
    if channels is not None:
        try:
            too_few = channels < 1
        except TypeError:
            raise ContractTypeError(f"{where}.channels must be null or a number >= 1, got {channels!r}") from None
        if too_few:
            raise ConfigError(f"{where}.channels must be null or >= 1, got {channels!r}")


@dataclass(frozen=True)
class Field:
    """One declared input or output: ESPnet3's ``Field`` for the standalone subset.

    Examples:
        >>> Field("reference_speech", "audio", optional=True).label
        'Reference speech'
        >>> Field("seg", "segments")
        Traceback (most recent call last):
        espnet3_prefect.errors.ConfigError: field 'seg'.kind: 'segments' needs espnet3 installed (pip install espnet==202611)
    """

    name: str
    kind: str
    label: str = ""
    optional: bool = False
    channels: Optional[int] = None
    options: Mapping[str, Any] = dataclass_field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _check_declaration(self.name, self.kind, self.channels, self.options, f"field {self.name!r}")
        if not self.label:
            object.__setattr__(self, "label", self.name.replace("_", " ").capitalize())


def _item(index: Any) -> str:
    return "dataset item" if index is None else f"dataset index {index!r}"


@dataclass(frozen=True)
class InferenceContract:
    """Declared inputs and outputs (standalone twin of ESPnet3's ``InferenceContract``)."""

    inputs: tuple[Field, ...]
    outputs: tuple[Field, ...]
    imports: tuple[str, ...] = ()

    def prepare_input(self, sample: Mapping[str, Any], model: Any, *, index: Any = None) -> dict[str, Any]:
        """A copy of ``sample`` with each declared input checked and converted by its kind.

        An optional input that is absent (or None) is dropped; a required one that is absent is a
        ``KeyError``. ``index`` only names the item in error messages.

        Examples:
            >>> contract = load_inference_contract({"inputs": {"text": {"kind": "text"}},
            ...                                     "outputs": {"hyp": {"kind": "text"}}})
            >>> contract.prepare_input({"text": "hi", "utt_id": "a"}, None)
            {'text': 'hi', 'utt_id': 'a'}
        """
        if not isinstance(sample, Mapping):
            raise TypeError(f"{_item(index)} must be a mapping of field names for a contract, got {type(sample).__name__}")
        prepared = dict(sample)
        for spec in self.inputs:
            if spec.name not in sample or (spec.optional and sample[spec.name] is None):
                if spec.optional:
                    prepared.pop(spec.name, None)
                    continue
                raise KeyError(f"contract.inputs.{spec.name}: required input {spec.name!r} is missing from {_item(index)}")
            kind = _KINDS[spec.kind]
            value = kind.apply(sample[spec.name], spec, model, spec.options, output=False,
                               where=f"input {spec.name!r} of {_item(index)}")
            prepared[spec.name] = kind.to_model_input(value, spec)
        return prepared

    def validate_input_keys(self, input_key: Any) -> None:
        """Require ``input_key`` (a name or a list) to name exactly the declared inputs.

        Examples:
            >>> contract = load_inference_contract({"inputs": {"text": {"kind": "text"}},
            ...                                     "outputs": {"hyp": {"kind": "text"}}})
            >>> contract.validate_input_keys(["text"])
            >>> contract.validate_input_keys("speech")  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ValueError: ...
        """
        if input_key is None:
            raise ValueError("inference input_key must be set when a contract: block is given")
        keys = [input_key] if isinstance(input_key, str) else list(input_key)
        declared = [spec.name for spec in self.inputs]
        if len(keys) != len(set(keys)) or set(keys) != set(declared):
            raise ValueError(
                f"input_key {keys} must name each field of contract.inputs {declared} exactly once")

    def prepare_output(self, result: Any, model: Any, *, idx: Any, idx_key: str, sample: Mapping) -> dict[str, Any]:
        """Check one result mapping against the declared outputs and attach ``idx_key``.

        The id comes from ``result[idx_key]``, else ``sample[idx_key]``, else ``str(idx)``.

        Examples:
            >>> contract = load_inference_contract({"inputs": {"text": {"kind": "text"}},
            ...                                     "outputs": {"hyp": {"kind": "text"}}})
            >>> contract.prepare_output({"hyp": "hi"}, None, idx=3, idx_key="utt_id", sample={})
            {'hyp': 'hi', 'utt_id': '3'}
        """
        where_item = _item(idx)
        if not isinstance(result, Mapping):
            raise TypeError(
                f"{where_item}: with a contract the model (after format_output) must return a mapping "
                f"of output names, got {type(result).__name__}")
        declared = [spec.name for spec in self.outputs]
        if idx_key in declared:
            raise ValueError(f"contract.outputs.{idx_key}: {idx_key!r} is the idx_key (it holds the utterance id); rename the output")
        extra = set(result) - set(declared) - {idx_key}
        if extra:
            raise ValueError(f"{where_item}: output(s) {sorted(extra, key=str)} are not declared in contract.outputs {declared}")
        prepared = {}
        for spec in self.outputs:
            if spec.name not in result:
                raise KeyError(f"contract.outputs.{spec.name}: declared output {spec.name!r} is missing from the result for {where_item}")
            prepared[spec.name] = _KINDS[spec.kind].apply(
                result[spec.name], spec, model, spec.options, output=True,
                where=f"output {spec.name!r} of {where_item}")
        prepared[idx_key] = result.get(idx_key, sample.get(idx_key, str(idx)))
        return prepared


def _section(raw: Any, section: str) -> tuple[Field, ...]:
    where_section = f"contract.{section}"
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(one_line(
            f"{where_section} needs at least one field (a mapping of field name to declaration), got {raw!r}"))
    fields = []
    for name, declaration in raw.items():
        where = f"{where_section}.{name}"
        if not isinstance(declaration, Mapping):
            raise ContractTypeError(
                f"{where} must be a mapping such as {{kind: text}}, got {type(declaration).__name__}")
        own = {key: value for key, value in declaration.items() if key in FIELD_KEYS}
        options = {key: value for key, value in declaration.items() if key not in FIELD_KEYS}
        own.setdefault("kind", None)
        _check_declaration(str(name), own["kind"], own.get("channels"), options, where)
        if section == "outputs" and own.get("optional"):
            raise ConfigError(f"{where}.optional: a declared output is always produced, so it cannot be optional")
        fields.append(Field(str(name), **own, options=options))
    return tuple(fields)


def _is_omegaconf(value: Any) -> bool:
    omegaconf = sys.modules.get("omegaconf")
    return omegaconf is not None and omegaconf.OmegaConf.is_config(value)


def _load_standalone(config: Any, allow_imports: bool) -> InferenceContract | None:
    if config is None:
        return None
    if _is_omegaconf(config):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    if not isinstance(config, Mapping):
        raise ContractTypeError(f"contract must be a mapping with inputs and outputs, got {type(config).__name__}")
    unknown = set(config) - set(_TOP_KEYS)
    if unknown:
        raise ConfigError(f"contract: unknown key(s) {sorted(unknown, key=str)}; allowed: {', '.join(_TOP_KEYS)}")
    imports = config.get("imports", ()) or ()
    if isinstance(imports, str):
        raise ContractTypeError(f"contract.imports must be a list of module names, got the string {imports!r}")
    imports = tuple(imports)
    if any(not isinstance(module, str) or not module for module in imports):
        raise ContractTypeError(f"contract.imports must hold module names, got {list(imports)!r}")
    if imports and not allow_imports:
        raise ConfigError("contract.imports is refused here: loading recipe modules needs trust_user_code=True")
    if imports:
        raise ConfigError(one_line(
            f"contract.imports: {list(imports)} needs espnet3 installed ({INSTALL_ESPNET3}): custom kinds "
            "and normalizers are registered in espnet3.contract"))
    return InferenceContract(
        inputs=_section(config.get("inputs"), "inputs"),
        outputs=_section(config.get("outputs"), "outputs"),
        imports=imports,
    )


# --------------------------------------------------------------------------- public entry points


def _is_upstream_contract(contract: Any) -> bool:
    module = sys.modules.get("espnet3.contract.inference")
    return module is not None and isinstance(contract, module.InferenceContract)


def load_inference_contract(config: Any, *, allow_imports: bool = True):
    """Build the contract from a ``contract:`` block (mapping or DictConfig); None gives None.

    Raises (standalone): ConfigError (a ValueError) or ContractTypeError (a TypeError too) naming
    the key, for unknown keys, kinds, options or normalizers, optional outputs, and for what needs
    espnet3 (``segments``, ``imports``).

    Examples:
        >>> load_inference_contract(None) is None
        True
        >>> contract = load_inference_contract({"inputs": {"speech": {"kind": "audio", "sample_rate": 16000}},
        ...                                     "outputs": {"text": {"kind": "text"}}})
        >>> [(f.name, f.kind) for f in contract.inputs + contract.outputs]
        [('speech', 'audio'), ('text', 'text')]
        >>> with standalone():
        ...     load_inference_contract({"inputs": {"x": {"kind": "text"}}, "outputs": {"y": {"kind": "text"}},
        ...                              "normalize": True})
        Traceback (most recent call last):
        espnet3_prefect.errors.ConfigError: contract: unknown key(s) ['normalize']; allowed: imports, inputs, outputs
    """
    upstream = upstream_module()
    if upstream is not None:
        return upstream.load_inference_contract(config, allow_imports=allow_imports)
    return _load_standalone(config, allow_imports)


def resolve_inference_contract(contract: Any, root: Optional[str] = None):
    """A contract from a loaded contract, its mapping form (as infer() ships it) or None.

    ``root`` (the recipe folder) is put on ``sys.path`` by ESPnet3 so ``contract.imports``
    resolve; the standalone implementation refuses imports, so it does not need it.

    Examples:
        >>> resolve_inference_contract(None) is None
        True
        >>> contract = resolve_inference_contract({"inputs": {"x": {"kind": "text"}},
        ...                                        "outputs": {"y": {"kind": "number"}}})
        >>> resolve_inference_contract(contract) is contract
        True
    """
    if contract is None:
        return None
    if isinstance(contract, InferenceContract):
        return contract
    upstream = upstream_module()
    if upstream is not None:
        return upstream.resolve_inference_contract(contract, root)
    if isinstance(contract, Mapping):
        return _load_standalone(contract, True)
    if _is_upstream_contract(contract):
        return contract
    raise TypeError(f"inference_contract must be an InferenceContract or its mapping form, got {type(contract).__name__}")


def _upstream_audio(value: Any) -> Any:
    """Our Audio as ESPnet3's (same float32 samples), so ESPnet3's kinds accept it."""
    if isinstance(value, Audio):
        return _upstream_audio_class()(value.array, value.rate)
    return value


def _shim_mapping(value: Any) -> Any:
    """A mapping whose values (or lists of values) of our Audio become ESPnet3's; else as is."""
    if not isinstance(value, Mapping):
        return value

    def has_ours(v):
        return isinstance(v, Audio) or (isinstance(v, (list, tuple)) and any(isinstance(x, Audio) for x in v))

    if not any(has_ours(v) for v in value.values()):
        return value
    out = {}
    for key, v in value.items():
        if isinstance(v, (list, tuple)):
            v = type(v)(_upstream_audio(x) for x in v)
        out[key] = _upstream_audio(v)
    return out


class _AudioShimDataset:
    """Reads items from a dataset, handing ESPnet3 its own Audio class."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getitem__(self, index):
        return _shim_mapping(self.dataset[index])


def prepare_inference_inputs(dataset: Any, idx: Any, contract: Any, model: Any):
    """Prepared and original samples, both keyed by dataset index, for one forward call.

    Examples:
        >>> contract = load_inference_contract({"inputs": {"x": {"kind": "text", "normalize": "strip"}},
        ...                                     "outputs": {"y": {"kind": "text"}}})
        >>> prepare_inference_inputs([{"x": " a "}, {"x": " b "}], [1], contract, None)
        ({1: {'x': 'b'}}, {1: {'x': ' b '}})
    """
    if not isinstance(contract, InferenceContract):
        if not _is_upstream_contract(contract):
            _bad_contract(contract)
        return _find_upstream().prepare_inference_inputs(_AudioShimDataset(dataset), idx, contract, model)
    indices = list(idx) if isinstance(idx, (list, tuple)) else [idx]
    original = {index: dataset[index] for index in indices}
    prepared = {index: contract.prepare_input(sample, model, index=index) for index, sample in original.items()}
    return prepared, original


def _bad_contract(contract: Any):
    raise TypeError(f"inference contract must be an InferenceContract (see resolve_inference_contract), got {type(contract).__name__}")


def validate_inference_outputs(result: Any, idx: Any, contract: Any, model: Any, original: Mapping, idx_key: str):
    """Check what the model returned for ``idx``: one output mapping per sample.

    A batch (``idx`` a list) may return a list of mappings, or one mapping whose every value is a
    list of the batch's length (split per sample). Returns one mapping, or a list for a batch.

    Examples:
        >>> contract = load_inference_contract({"inputs": {"x": {"kind": "text"}},
        ...                                     "outputs": {"y": {"kind": "number"}}})
        >>> validate_inference_outputs({"y": [1, 2.5]}, [4, 7], contract, None,
        ...                            {4: {"utt_id": "u4"}, 7: {}}, "utt_id")
        [{'y': 1, 'utt_id': 'u4'}, {'y': 2.5, 'utt_id': '7'}]
        >>> validate_inference_outputs([{"y": 1}], [4, 7], contract, None, {4: {}, 7: {}}, "utt_id")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: ...
    """
    if not isinstance(contract, InferenceContract):
        if not _is_upstream_contract(contract):
            _bad_contract(contract)
        if isinstance(result, list):
            result = [_shim_mapping(item) for item in result]
        else:
            result = _shim_mapping(result)
        return _find_upstream().validate_inference_outputs(result, idx, contract, model, original, idx_key)
    batched = isinstance(idx, (list, tuple))
    indices = list(idx) if batched else [idx]
    if batched and isinstance(result, Mapping):
        if all(isinstance(v, (list, tuple)) and len(v) == len(indices) for v in result.values()):
            result = [{key: values[pos] for key, values in result.items()} for pos in range(len(indices))]
    results = result if isinstance(result, list) else [result]
    if len(results) != len(indices):
        raise ValueError(one_line(
            f"dataset indices {indices}: a contracted model must return one output mapping per sample "
            f"(a list of {len(indices)} mappings, or a mapping of {len(indices)}-long lists), got "
            f"{len(results)} result(s)"))
    outputs = [
        contract.prepare_output(value, model, idx=index, idx_key=idx_key, sample=original[index])
        for index, value in zip(indices, results)
    ]
    return outputs if batched else outputs[0]


__all__ = [
    "Audio", "ContractTypeError", "ESPNET3_VERSION", "Field", "InferenceContract",
    "SUPPORTED_KINDS", "delegates", "is_audio", "load_inference_contract", "prepare_inference_inputs",
    "resolve_inference_contract", "standalone", "upstream_module", "validate_inference_outputs",
]
