"""The kinds a standalone contract field may declare (``text``, ``number``, ``audio``): each kind's
options, value check and normalizers, and the check of one field declaration; ESPnet3 keeps its
kinds apart from its contract the same way (``espnet3.contract.kinds``).

Used by :mod:`espnet3_prefect.espnet3.contract` (``Field``, ``InferenceContract``), which re-exports
:class:`ContractTypeError` and :data:`SUPPORTED_KINDS`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from espnet3_prefect.errors import ConfigError, one_line
from espnet3_prefect.espnet3.audio import INSTALL_ESPNET3, Audio, is_audio

# Keys of one field declaration that describe the field itself; every other key is a kind option.
FIELD_KEYS = ("kind", "label", "optional", "channels")
# Kinds ESPnet3 202611 has built in that only it implements.
NEEDS_ESPNET3_KINDS = ("segments",)


class ContractTypeError(ConfigError, TypeError):
    """A ``contract:`` entry has the wrong type (where ESPnet3 raises ``TypeError``)."""


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
            raise ConfigError(
                one_line(
                    f"{where}: unknown option(s) {sorted(unknown, key=str)} for kind {self.name!r}; "
                    f"allowed: {', '.join(allowed)}"
                )
            )
        names = _normalizer_names(options)
        if not isinstance(names, (list, tuple)) or any(not isinstance(n, str) for n in names):
            raise ContractTypeError(
                one_line(f"{where}.normalize must be a normalizer name or a list of names, got {names!r}")
            )
        unknown = set(names) - set(self.normalizers)
        if unknown:
            known = ", ".join(self.normalizers) or "none"
            raise ConfigError(
                one_line(
                    f"{where}.normalize: unknown normalizer(s) {sorted(unknown)} for kind {self.name!r} "
                    f"(built in: {known}); custom normalizers (contract.imports + register_normalizer) "
                    f"need espnet3 installed ({INSTALL_ESPNET3})"
                )
            )

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
                        "use rate_policy: resample to convert it)"
                    )
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
                    "no model.sample_rate): return an Audio or a (rate, samples) pair"
                )
            audio = Audio(value, rate)
        else:
            audio = Audio.coerce(value, rate)
        want = field.channels
        if want is not None and audio.channels != want:
            raise TypeError(f"{where} has {audio.channels} channel(s), contract wants channels: {want}")
        return audio


#: The standalone kinds by name.
KINDS: dict[str, _Kind] = {"audio": _AudioKind(), "number": _NumberKind(), "text": _TextKind()}
#: Kinds the standalone implementation supports, and their built-in normalizers.
SUPPORTED_KINDS = {name: tuple(kind.normalizers) for name, kind in sorted(KINDS.items())}


# --------------------------------------------------------------------------- declarations


def check_declaration(name: Any, kind: Any, channels: Any, options: Any, where: str) -> None:
    """Check one field's declaration (its kind, channels and kind options); errors name ``where``."""
    if not isinstance(kind, str) or kind not in KINDS:
        if kind in NEEDS_ESPNET3_KINDS:
            raise ConfigError(f"{where}.kind: {kind!r} needs espnet3 installed ({INSTALL_ESPNET3})")
        if kind is None:
            raise ConfigError(f"{where}.kind is missing; one of {sorted(KINDS)}")
        raise ConfigError(
            one_line(
                f"{where}.kind: unknown kind {kind!r}; built in: {sorted(KINDS)} "
                f"({', '.join(NEEDS_ESPNET3_KINDS)} and custom kinds from contract.imports need espnet3 "
                f"installed: {INSTALL_ESPNET3})"
            )
        )
    if not isinstance(options, Mapping):
        raise ContractTypeError(f"{where}: kind options must be a mapping, got {type(options).__name__}")
    KINDS[kind].validate_options(options, where)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"{where}: field name {name!r} must be a Python identifier")
    if channels is not None:
        try:
            too_few = channels < 1
        except TypeError:
            raise ContractTypeError(f"{where}.channels must be null or a number >= 1, got {channels!r}") from None
        if too_few:
            raise ConfigError(f"{where}.channels must be null or >= 1, got {channels!r}")
