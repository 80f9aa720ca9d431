"""Case (f): a recipe shaped like egs3/TEMPLATE/esp2_asr: an ASR-style runner whose
``prepare_model_inputs`` hands the backend plain arrays and whose ``format_output`` picks the best
of an n-best list (as the TEMPLATE's ASRInferenceRunner does for Speech2Text), under a contract
with a text and an audio output."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..compat import InferenceRunner
from ..models import DigitNet, as_array


class NBestDigitNet(DigitNet):
    """Answers ``(n-best [(word, score), ...], the first 0.05 s it heard)`` per item."""

    def __call__(self, speech: Any) -> Any:
        if isinstance(speech, list):
            return [self(s) for s in speech]
        return self.nbest(speech, 3), np.asarray(speech[:400], dtype=np.float32)


class ASRStyleRunner(InferenceRunner):
    @staticmethod
    def prepare_model_inputs(inputs):
        return {
            key: ([as_array(v) for v in value] if isinstance(value, list) else as_array(value))
            for key, value in inputs.items()
        }

    @staticmethod
    def format_output(result, *, batched):
        def best(one):
            nbest, heard = one
            return {"text": nbest[0][0], "audio": (8000, heard)}

        return [best(r) for r in result] if batched else best(result)
