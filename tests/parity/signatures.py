"""Signatures of ESPnet3 202611's runner/provider classes, their hooks and the two stage entry
points, beside espnet3-prefect's, as JSON (run in ``.venv-parity``, where both import)::

    .venv-parity/bin/python -m tests.parity.signatures

Per (class, method): how it is bound (staticmethod, classmethod, function, missing) and its
parameters as ``[name, kind, default]`` (annotations are left out: spelling differs, contract not).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

CLASSES = {
    "BaseRunner": ("espnet3.parallel.base_runner.BaseRunner", "espnet3_prefect.BaseRunner"),
    "InferenceRunner": ("espnet3.systems.base.inference_runner.InferenceRunner", "espnet3_prefect.InferenceRunner"),
    "EnvironmentProvider": ("espnet3.parallel.env_provider.EnvironmentProvider", "espnet3_prefect.EnvironmentProvider"),
    "InferenceProvider": (
        "espnet3.systems.base.inference_provider.InferenceProvider",
        "espnet3_prefect.InferenceProvider",
    ),
}
HOOKS = (
    "__init__",
    "__call__",
    "forward",
    "open_writers",
    "write_record",
    "close_writers",
    "merge",
    "init_state",
    "reduce_state",
    "finalize_state",
    "prepare_model_inputs",
    "format_output",
    "build_env_local",
    "build_worker_setup_fn",
    "build_dataset",
    "build_model",
)
FUNCTIONS = {
    "infer": ("espnet3.systems.base.inference.infer", "espnet3_prefect.infer"),
    "measure": ("espnet3.systems.base.metric.measure", "espnet3_prefect.measure"),
}


def locate(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        return exc


def parameters(fn: Any) -> list[list[str]]:
    return [
        [p.name, p.kind.name, "<required>" if p.default is p.empty else repr(p.default)]
        for p in inspect.signature(fn).parameters.values()
    ]


def method_info(cls: Any, name: str) -> dict[str, Any]:
    if isinstance(cls, Exception):
        return {"binding": f"class not importable: {type(cls).__name__}: {cls}"}
    if not hasattr(cls, name):
        return {"binding": "missing"}
    raw = inspect.getattr_static(cls, name)
    binding = type(raw).__name__  # staticmethod, classmethod, function
    defined_in = next((k.__qualname__ for k in cls.__mro__ if name in vars(k)), "?")
    try:
        params = parameters(getattr(cls, name))
    except (TypeError, ValueError) as exc:
        params = [[f"<no signature: {exc}>"]]
    return {"binding": binding, "params": params, "defined_in": defined_in}


def function_info(fn: Any) -> dict[str, Any]:
    if isinstance(fn, Exception):
        return {"binding": f"not importable: {type(fn).__name__}: {fn}"}
    return {"binding": "function", "params": parameters(fn)}


def collect() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, (theirs, ours) in CLASSES.items():
        up_cls, our_cls = locate(theirs), locate(ours)
        for hook in HOOKS:
            up = method_info(up_cls, hook)
            if up.get("binding") == "missing":
                continue  # only what 202611 defines is part of the contract
            if hook in ("__init__", "__call__") and up.get("defined_in") in ("object", "ABC", "?"):
                continue
            out[f"{label}.{hook}"] = {"espnet3": up, "espnet3_prefect": method_info(our_cls, hook)}
    for label, (theirs, ours) in FUNCTIONS.items():
        out[label] = {"espnet3": function_info(locate(theirs)), "espnet3_prefect": function_info(locate(ours))}
    return out


if __name__ == "__main__":
    json.dump(collect(), sys.stdout, indent=1, sort_keys=True)
    print()
