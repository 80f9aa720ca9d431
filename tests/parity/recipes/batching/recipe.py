"""Case (c): ``batch_size: 4`` on 13 items; the model reports the size of every batch it is given,
and ``batch_size.scp`` records it per item (upstream: 4, 4, 4, 4 x3 then 1)."""

from __future__ import annotations

from typing import Any

from ..models import DTMFModel


class BatchRecordingRecognizer(DTMFModel):
    """The DTMF recognizer, answering ``(text, batch size)`` per item."""

    def __call__(self, speech: Any) -> Any:
        if isinstance(speech, list):
            return [(text, len(speech)) for text in super().__call__(speech)]
        return (super().__call__(speech), 0)  # 0: called without a batch


def output_fn(data: Any, model_output: Any, idx: Any) -> Any:
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    text, batch = model_output
    return {"utt_id": data["utt_id"], "hyp": text, "batch_size": batch}
