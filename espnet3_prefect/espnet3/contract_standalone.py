"""The standalone inference contract: ``Field``, ``InferenceContract`` and the loader of a
``contract:`` block, used by :mod:`espnet3_prefect.espnet3.contract` where it does not hand the work to
espnet3 (moved out of ``contract.py``, which re-exports :class:`Field` and
:class:`InferenceContract`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from espnet3_prefect.errors import ConfigError, one_line
from espnet3_prefect.espnet3.audio import INSTALL_ESPNET3
from espnet3_prefect.espnet3.contract_kinds import FIELD_KEYS, KINDS, ContractTypeError, check_declaration

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
