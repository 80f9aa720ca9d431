"""Hook recorder: a runner and a provider that log every call they get, then do the stock thing.

Each call appends one JSON line to ``$E3P_HOOK_LOG`` (O_APPEND, so workers may share the file):
``{"hook", "args", "kwargs"}`` with every value described by :func:`describe` (types for
objects, values for plain data). The parity test runs this recipe through upstream ``infer()``
and through espnet3-prefect and compares the two logs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..compat import InferenceProvider, InferenceRunner


def describe(value: Any, depth: int = 0) -> Any:
    """A JSON-able, comparable picture of ``value``: plain values as they are (ints and floats
    tagged), paths tagged, sequences element by element, mappings (dict or DictConfig alike) by
    their sorted keys, anything else by its type name."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"float": value}
    if isinstance(value, Path):
        return {"Path": str(value)}
    if hasattr(value, "keys") and hasattr(value, "items"):
        return {"keys": sorted(str(k) for k in value.keys())}
    if isinstance(value, (set, frozenset)):
        return {"set": sorted(str(v) for v in value)}
    if depth < 3 and (isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig"):
        return {"tuple" if isinstance(value, tuple) else "list": [describe(v, depth + 1) for v in value]}
    return {"obj": type(value).__name__}


def record(hook: str, args: tuple = (), kwargs: dict | None = None, **extra: Any) -> None:
    path = os.environ.get("E3P_HOOK_LOG")
    if not path:
        return
    line = {
        "hook": hook,
        "args": [describe(a) for a in args],
        "kwargs": {k: describe(v) for k, v in sorted((kwargs or {}).items())},
    }
    line.update({k: (v if isinstance(v, dict) else describe(v)) for k, v in extra.items()})
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, sort_keys=True) + "\n")


class RecordingProvider(InferenceProvider):
    def __init__(self, *args, **kwargs):
        record("provider.__init__", args, kwargs)
        super().__init__(*args, **kwargs)

    def build_env_local(self):
        record("provider.build_env_local")
        return super().build_env_local()

    def build_worker_setup_fn(self):
        record("provider.build_worker_setup_fn")
        return super().build_worker_setup_fn()

    @staticmethod
    def build_dataset(config):
        record("provider.build_dataset", (config,))
        return InferenceProvider.build_dataset(config)

    @staticmethod
    def build_model(config):
        record("provider.build_model", (config,))
        return InferenceProvider.build_model(config)


class RecordingRunner(InferenceRunner):
    def __init__(self, *args, **kwargs):
        record("runner.__init__", args, kwargs)
        super().__init__(*args, **kwargs)

    @classmethod
    def forward(cls, *args, **kwargs):
        record("forward", args, kwargs)
        return super().forward(*args, **kwargs)

    @staticmethod
    def prepare_model_inputs(*args, **kwargs):
        record("prepare_model_inputs", args, kwargs)
        return InferenceRunner.prepare_model_inputs(*args, **kwargs)

    @staticmethod
    def format_output(*args, **kwargs):
        record("format_output", args, kwargs)
        return InferenceRunner.format_output(*args, **kwargs)

    @classmethod
    def init_state(cls, *args, **kwargs):
        record("init_state", args, kwargs)
        return super().init_state(*args, **kwargs)

    @classmethod
    def reduce_state(cls, *args, **kwargs):
        record("reduce_state", args, kwargs)
        return super().reduce_state(*args, **kwargs)

    @classmethod
    def finalize_state(cls, *args, **kwargs):
        record("finalize_state", args, kwargs)
        return super().finalize_state(*args, **kwargs)

    @staticmethod
    def open_writers(*args, **kwargs):
        record("open_writers", args, kwargs)
        return InferenceRunner.open_writers(*args, **kwargs)

    @staticmethod
    def write_record(*args, **kwargs):
        record("write_record", args, kwargs)
        return InferenceRunner.write_record(*args, **kwargs)

    @staticmethod
    def close_writers(*args, **kwargs):
        record("close_writers", args, kwargs)
        return InferenceRunner.close_writers(*args, **kwargs)

    def merge(self, *args, **kwargs):
        provider = self.provider
        params = getattr(provider, "params", None) or {}
        config = getattr(provider, "config", None) or {}
        attributes = {
            f"self.{name}": getattr(self, name, "<missing>")
            for name in ("batch_size", "output_dir", "shard_subdir", "resume", "idx_key", "hyp_key", "ref_key")
        }
        record(
            "merge",
            args,
            kwargs,
            **attributes,
            provider_class=type(provider).__name__,
            provider_params={k: describe(v) for k, v in sorted(params.items())},
            provider_params_in_config=sorted(k for k in params if k in config),
        )
        return super().merge(*args, **kwargs)
