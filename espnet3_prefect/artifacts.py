"""PLACEHOLDER (lead): replaced by the `contract` helper's module at merge time."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np


def check_utt_id(value) -> str:
    name = str(value)
    if not name or name in (".", "..") or any(c.isspace() for c in name) or "/" in name or "\\" in name:
        raise ValueError(f"utterance id {name!r} cannot head an SCP line or name a file")
    return name


def materialize_output_value(idx_value, field_key, value, output_dir, artifact_config):
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "detach"):
        if value.dim() == 0:
            return value.item()
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, (list, tuple)):
        raise TypeError(f"top-level list outputs are not supported for {field_key!r}")
    base = Path(output_dir) / field_key
    base.mkdir(parents=True, exist_ok=True)
    path = base / str(idx_value)
    if isinstance(value, np.ndarray):
        path = path.with_name(path.name + ".npy"); np.save(path, value)
    elif isinstance(value, dict):
        path = path.with_name(path.name + ".json"); path.write_text(json.dumps(value, ensure_ascii=False, indent=2))
    else:
        path = path.with_name(path.name + ".pkl"); path.write_bytes(pickle.dumps(value))
    return path.as_posix()
