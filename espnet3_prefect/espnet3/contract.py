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
:mod:`espnet3_prefect.espnet3.artifacts`, use their own implementation even where espnet3 is importable.

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
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from espnet3_prefect.errors import ConfigError, one_line
from espnet3_prefect.espnet3.audio import (
    ESPNET3_VERSION,
    INSTALL_ESPNET3,
    Audio,
    AudioShimDataset,
    is_audio,
    shim_mapping,
)
from espnet3_prefect.espnet3.contract_kinds import (
    FIELD_KEYS,
    KINDS,
    SUPPORTED_KINDS,
    ContractTypeError,
    check_declaration,
)

# --------------------------------------------------------------------------- the standalone contract

_TOP_KEYS = ("imports", "inputs", "outputs")


@dataclass(frozen=True)
class Field:
    """One declared input or output: ESPnet3's ``Field`` for the standalone subset.

    Examples:
        >>> Field("reference_speech", "audio", optional=True).label
        'Reference speech'
        >>> Field("seg", "segments")  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        espnet3_prefect.errors.ConfigError: field 'seg'.kind: 'segments' needs espnet3 installed (pip install
        espnet==202611)
    """

    name: str
    kind: str
    label: str = ""
    optional: bool = False
    channels: int | None = None
    options: Mapping[str, Any] = dataclass_field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        check_declaration(self.name, self.kind, self.channels, self.options, f"field {self.name!r}")
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
            >>> from espnet3_prefect.espnet3.contract import load_inference_contract
            >>> contract = load_inference_contract({"inputs": {"text": {"kind": "text"}},
            ...                                     "outputs": {"hyp": {"kind": "text"}}})
            >>> contract.prepare_input({"text": "hi", "utt_id": "a"}, None)
            {'text': 'hi', 'utt_id': 'a'}
        """
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"{_item(index)} must be a mapping of field names for a contract, got {type(sample).__name__}"
            )
        prepared = dict(sample)
        for spec in self.inputs:
            if spec.name not in sample or (spec.optional and sample[spec.name] is None):
                if spec.optional:
                    prepared.pop(spec.name, None)
                    continue
                raise KeyError(
                    f"contract.inputs.{spec.name}: required input {spec.name!r} is missing from {_item(index)}"
                )
            kind = KINDS[spec.kind]
            value = kind.apply(
                sample[spec.name],
                spec,
                model,
                spec.options,
                output=False,
                where=f"input {spec.name!r} of {_item(index)}",
            )
            prepared[spec.name] = kind.to_model_input(value, spec)
        return prepared

    def validate_input_keys(self, input_key: Any) -> None:
        """Require ``input_key`` (a name or a list) to name exactly the declared inputs.

        Examples:
            >>> from espnet3_prefect.espnet3.contract import load_inference_contract
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
            raise ValueError(f"input_key {keys} must name each field of contract.inputs {declared} exactly once")

    def prepare_output(self, result: Any, model: Any, *, idx: Any, idx_key: str, sample: Mapping) -> dict[str, Any]:
        """Check one result mapping against the declared outputs and attach ``idx_key``.

        The id comes from ``result[idx_key]``, else ``sample[idx_key]``, else ``str(idx)``.

        Examples:
            >>> from espnet3_prefect.espnet3.contract import load_inference_contract
            >>> contract = load_inference_contract({"inputs": {"text": {"kind": "text"}},
            ...                                     "outputs": {"hyp": {"kind": "text"}}})
            >>> contract.prepare_output({"hyp": "hi"}, None, idx=3, idx_key="utt_id", sample={})
            {'hyp': 'hi', 'utt_id': '3'}
        """
        where_item = _item(idx)
        if not isinstance(result, Mapping):
            raise TypeError(
                f"{where_item}: with a contract the model (after format_output) must return a mapping "
                f"of output names, got {type(result).__name__}"
            )
        declared = [spec.name for spec in self.outputs]
        if idx_key in declared:
            raise ValueError(
                f"contract.outputs.{idx_key}: {idx_key!r} is the idx_key (it holds the utterance id); rename the output"
            )
        extra = set(result) - set(declared) - {idx_key}
        if extra:
            raise ValueError(
                f"{where_item}: output(s) {sorted(extra, key=str)} are not declared in contract.outputs {declared}"
            )
        prepared = {}
        for spec in self.outputs:
            if spec.name not in result:
                raise KeyError(
                    f"contract.outputs.{spec.name}: declared output {spec.name!r} is missing from the result "
                    f"for {where_item}"
                )
            prepared[spec.name] = KINDS[spec.kind].apply(
                result[spec.name], spec, model, spec.options, output=True, where=f"output {spec.name!r} of {where_item}"
            )
        prepared[idx_key] = result.get(idx_key, sample.get(idx_key, str(idx)))
        return prepared


def _section(raw: Any, section: str) -> tuple[Field, ...]:
    where_section = f"contract.{section}"
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            one_line(f"{where_section} needs at least one field (a mapping of field name to declaration), got {raw!r}")
        )
    fields = []
    for name, declaration in raw.items():
        where = f"{where_section}.{name}"
        if not isinstance(declaration, Mapping):
            raise ContractTypeError(
                f"{where} must be a mapping such as {{kind: text}}, got {type(declaration).__name__}"
            )
        own = {key: value for key, value in declaration.items() if key in FIELD_KEYS}
        options = {key: value for key, value in declaration.items() if key not in FIELD_KEYS}
        own.setdefault("kind", None)
        check_declaration(str(name), own["kind"], own.get("channels"), options, where)
        if section == "outputs" and own.get("optional"):
            raise ConfigError(f"{where}.optional: a declared output is always produced, so it cannot be optional")
        fields.append(Field(str(name), **own, options=options))
    return tuple(fields)


def _is_omegaconf(value: Any) -> bool:
    omegaconf = sys.modules.get("omegaconf")
    return omegaconf is not None and omegaconf.OmegaConf.is_config(value)


def load_standalone(config: Any, allow_imports: bool) -> InferenceContract | None:
    """The ``contract`` block as our own :class:`InferenceContract` (None when there is none), checked."""
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
        raise ConfigError(
            one_line(
                f"contract.imports: {list(imports)} needs espnet3 installed ({INSTALL_ESPNET3}): custom kinds "
                "and normalizers are registered in espnet3.contract"
            )
        )
    return InferenceContract(
        inputs=_section(config.get("inputs"), "inputs"),
        outputs=_section(config.get("outputs"), "outputs"),
        imports=imports,
    )


#: True: never hand work to espnet3, even where it is importable (this module and ``artifacts``).
STANDALONE = False


# --------------------------------------------------------------------------- delegation


@functools.cache
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
        >>> with standalone():  # doctest: +NORMALIZE_WHITESPACE
        ...     load_inference_contract({"inputs": {"x": {"kind": "text"}},
        ...                              "outputs": {"seg": {"kind": "segments"}}})
        Traceback (most recent call last):
        espnet3_prefect.errors.ConfigError: contract.outputs.seg.kind: 'segments' needs espnet3 installed (pip install
        espnet==202611)
    """
    global STANDALONE
    saved, STANDALONE = STANDALONE, enabled
    try:
        yield
    finally:
        STANDALONE = saved


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
    return load_standalone(config, allow_imports)


def resolve_inference_contract(contract: Any, root: str | None = None):
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
        return load_standalone(contract, True)
    if _is_upstream_contract(contract):
        return contract
    raise TypeError(
        f"inference_contract must be an InferenceContract or its mapping form, got {type(contract).__name__}"
    )


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
        return _find_upstream().prepare_inference_inputs(AudioShimDataset(dataset), idx, contract, model)
    indices = list(idx) if isinstance(idx, (list, tuple)) else [idx]
    original = {index: dataset[index] for index in indices}
    prepared = {index: contract.prepare_input(sample, model, index=index) for index, sample in original.items()}
    return prepared, original


def _bad_contract(contract: Any):
    raise TypeError(
        "inference contract must be an InferenceContract (see resolve_inference_contract), "
        f"got {type(contract).__name__}"
    )


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
            result = [shim_mapping(item) for item in result]
        else:
            result = shim_mapping(result)
        return _find_upstream().validate_inference_outputs(result, idx, contract, model, original, idx_key)
    batched = isinstance(idx, (list, tuple))
    indices = list(idx) if batched else [idx]
    if batched and isinstance(result, Mapping):
        if all(isinstance(v, (list, tuple)) and len(v) == len(indices) for v in result.values()):
            result = [{key: values[pos] for key, values in result.items()} for pos in range(len(indices))]
    results = result if isinstance(result, list) else [result]
    if len(results) != len(indices):
        raise ValueError(
            one_line(
                f"dataset indices {indices}: a contracted model must return one output mapping per sample "
                f"(a list of {len(indices)} mappings, or a mapping of {len(indices)}-long lists), got "
                f"{len(results)} result(s)"
            )
        )
    outputs = [
        contract.prepare_output(value, model, idx=index, idx_key=idx_key, sample=original[index])
        for index, value in zip(indices, results)
    ]
    return outputs if batched else outputs[0]


__all__ = [
    "Audio",
    "ContractTypeError",
    "ESPNET3_VERSION",
    "Field",
    "InferenceContract",
    "SUPPORTED_KINDS",
    "delegates",
    "is_audio",
    "load_inference_contract",
    "prepare_inference_inputs",
    "resolve_inference_contract",
    "standalone",
    "upstream_module",
    "validate_inference_outputs",
]
