"""What a metric declares and gets, checked as ESPnet3 202611 checks it: the ``inputs``/``outputs``
declaration, the ``inputs:`` binding of a metrics config, one batch for ``update`` and the result
of ``compute``. Moved out of ``metrics.py``, which re-exports the public names.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from espnet3_prefect.errors import ConfigError, Espnet3PrefectError

#: ``dataset:<column>`` binds a metric input to a column of the test set itself.
DATASET_PREFIX = "dataset:"
#: The kinds a metric field may declare (ESPnet3's ``KINDS``).
METRIC_KINDS = ("audio", "number", "segments", "text")

try:  # one Field for the whole package once the contract library is there
    from espnet3_prefect.espnet3.contract import Field  # type: ignore[attr-defined]
except ImportError:

    @dataclass(frozen=True)
    class Field:  # type: ignore[no-redef]
        """One declared input or output of a metric (ESPnet3's ``espnet3.contract.Field``).

        >>> Field("ref_text", "text").label
        'Ref text'
        """

        name: str
        kind: str
        label: str = ""
        optional: bool = False

        def __post_init__(self) -> None:
            if not isinstance(self.name, str) or not self.name.isidentifier():
                raise ConfigError(f"Field name {self.name!r} must be a Python identifier")
            if self.kind not in METRIC_KINDS:
                raise ConfigError(f"Field {self.name!r} has kind {self.kind!r}; known kinds: {', '.join(METRIC_KINDS)}")
            if not self.label:
                object.__setattr__(self, "label", self.name.replace("_", " ").capitalize())


class MetricContractError(Espnet3PrefectError, ValueError):
    """A metric's inputs, batch or result do not match what it declares (ESPnet3's error of that name)."""


class MetricDeclarationError(ConfigError, TypeError):
    """A metric's ``inputs``/``outputs`` declaration is missing or malformed (a ``TypeError`` upstream)."""


# -- the contract ----------------------------------------------------------------------------------


def check_metric_contract(metric: Any) -> None:
    """Raise :class:`MetricDeclarationError` unless ``inputs`` and ``outputs`` are well declared.

    Both are non-empty tuples of fields with distinct identifier names and known kinds; required
    inputs come before optional ones; outputs are never optional and all of kind ``number``.
    """
    name = type(metric).__qualname__
    if not (hasattr(metric, "inputs") or hasattr(metric, "outputs")):
        raise MetricDeclarationError(
            f"{name} declares no inputs/outputs; declare them as tuples of Field "
            "(class attributes, or on self before super().__init__())"
        )
    for attr in ("inputs", "outputs"):
        fields = getattr(metric, attr, None)
        if not isinstance(fields, tuple) or not all(hasattr(f, "name") and hasattr(f, "kind") for f in fields):
            raise MetricDeclarationError(f"{name}.{attr} must be a tuple of Field")
        if not fields:
            raise MetricDeclarationError(f"{name}.{attr} must name at least one field")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise MetricDeclarationError(f"{name}.{attr} names a field twice: {names}")
        if any(f.kind not in METRIC_KINDS for f in fields):
            bad = next(f for f in fields if f.kind not in METRIC_KINDS)
            raise MetricDeclarationError(f"{name}.{attr} field {bad.name!r} has unknown kind {bad.kind!r}")
        optional = [bool(getattr(f, "optional", False)) for f in fields]
        if attr == "inputs" and optional != sorted(optional):
            raise MetricDeclarationError(f"{name}.inputs must list required fields before optional ones")
        if attr == "outputs" and any(optional):
            raise MetricDeclarationError(f"{name}.outputs cannot hold an optional field")
    for f in metric.outputs:
        if f.kind != "number":
            raise MetricDeclarationError(f"{name}.outputs field {f.name!r} must have kind 'number', not {f.kind!r}")


def check_metric_inputs(metric: Any, inputs: Any, where: str = "inputs") -> dict[str, str] | None:
    """The ``inputs:`` binding as ``{declared name: source}``; ``None`` when nothing is declared.

    ``inputs`` is a mapping name -> source, or a list of names that are their own sources. Every
    required input must be bound, no unknown name may be, and each source is a non-empty SCP
    stem or ``dataset:<column>``. Errors are one-line :class:`ConfigError` naming ``where``.
    """
    fields = getattr(metric, "inputs", None) or ()
    if not fields:
        return None
    if isinstance(fields, Mapping):  # ESPnet3 also reads {name: type} declarations
        declared = list(fields)
        required = [n for n, expected in fields.items() if not isinstance(None, expected)]
    else:
        declared = [f.name for f in fields]
        required = [f.name for f in fields if not getattr(f, "optional", False)]
    cls = type(metric).__name__
    if inputs is None:
        raise ConfigError(
            f"{where}: missing; {cls} declares inputs {', '.join(declared)}: bind each to an SCP "
            f"stem or dataset:<column>, e.g. {{ref: dataset:text, hyp: text}}"
        )
    if isinstance(inputs, Mapping):
        bindings = {str(k): v for k, v in inputs.items()}
    elif isinstance(inputs, (list, tuple)):
        bindings = {str(n): n for n in inputs}
    else:
        raise ConfigError(f"{where}: must map each declared input of {cls} to a source, got {inputs!r}")
    missing = [n for n in required if n not in bindings]
    unknown = [n for n in bindings if n not in declared]
    if missing or unknown:
        raise ConfigError(f"{where}: {cls} declares inputs {', '.join(declared)}; missing {missing}, unknown {unknown}")
    for name, source in bindings.items():
        if not isinstance(source, str) or not source or source == DATASET_PREFIX:
            raise ConfigError(f"{where}.{name}: {source!r} must be an SCP stem like 'text' or dataset:<column>")
    return bindings


def _is_number(value: Any) -> bool:
    try:
        import numpy as np

        if isinstance(value, np.bool_):
            return False
    except ImportError:  # pragma: no cover
        pass
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_metric_output(metric: Any, result: Mapping[str, Any]) -> None:
    """Raise :class:`MetricContractError` unless every declared output is in ``result`` as a real number."""
    outputs = getattr(metric, "outputs", None)
    if not outputs:
        return
    cls = type(metric).__name__
    names = [f.name for f in outputs]
    missing = [n for n in names if n not in result]
    if missing:
        raise MetricContractError(f"{cls} declares outputs {names} but returned {sorted(result)}; missing {missing}")
    for n in names:
        if not _is_number(result[n]):
            raise MetricContractError(
                f"{cls}.outputs field {n!r} must be number: returned as "
                f"{type(result[n]).__name__}, must be a real number"
            )


def _accepts(kind: str, value: Any) -> bool:
    if kind == "text":
        return isinstance(value, str)
    if kind == "number":
        return _is_number(value)
    return True  # audio (a path, an array, ...) and segments: checked by the metric itself


def check_metric_batch(metric: Any, values: Mapping[str, Any]) -> None:
    """Raise :class:`MetricContractError` unless ``values`` is one good batch for ``metric.update``.

    No undeclared name; every required name present; each value a list or tuple; equal lengths;
    ``text`` elements are ``str`` and ``number`` elements real numbers.
    """
    cls = type(metric).__name__
    fields = {f.name: f for f in getattr(metric, "inputs", ())}
    declared = ", ".join(fields)
    for key in values:
        if key not in fields:
            raise MetricContractError(f"{cls} got input {key!r}; declared inputs: {declared}")
    given = {}
    for key, field in fields.items():
        value = values.get(key)
        if value is None:
            if getattr(field, "optional", False):
                continue
            raise MetricContractError(f"{cls} input {key!r} is missing; declared inputs: {declared}")
        if not isinstance(value, (list, tuple)):
            raise MetricContractError(f"{cls} input {key!r} must be a list or tuple, not {type(value).__name__}")
        given[key] = value
    if given:
        first, *rest = given
        for key in rest:
            if len(given[key]) != len(given[first]):
                raise MetricContractError(
                    f"{cls} input {key!r} has {len(given[key])} items, {first!r} has {len(given[first])}"
                )
    for key, value in given.items():
        for i, elem in enumerate(value):
            if not _accepts(fields[key].kind, elem):
                raise MetricContractError(
                    f"{cls} input {key!r}[{i}] is {type(elem).__name__}, must be {fields[key].kind}"
                )
