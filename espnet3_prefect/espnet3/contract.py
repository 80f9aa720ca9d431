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
from typing import Any

from espnet3_prefect.errors import one_line
from espnet3_prefect.espnet3.audio import ESPNET3_VERSION, Audio, AudioShimDataset, is_audio, shim_mapping
from espnet3_prefect.espnet3.contract_kinds import SUPPORTED_KINDS, ContractTypeError
from espnet3_prefect.espnet3.contract_standalone import Field, InferenceContract, load_standalone

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
