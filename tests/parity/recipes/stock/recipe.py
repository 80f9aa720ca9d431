"""Case (a): the stock InferenceRunner and InferenceProvider with a legacy ``output_fn``."""

from __future__ import annotations

from typing import Any


def output_fn(data: Any, model_output: Any, idx: Any) -> Any:
    """``hyp``/``ref`` (written: ``output_keys``) and ``n_samples`` (returned, not written)."""
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {
        "utt_id": data["utt_id"],
        "hyp": model_output,
        "ref": data["text"],
        "n_samples": int(data["speech"].shape[0]),
    }
