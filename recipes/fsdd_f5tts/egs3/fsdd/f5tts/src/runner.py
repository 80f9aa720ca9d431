"""The recipe's inference runner: ESPnet3's shared ``InferenceRunner`` with F5-TTS's reference audio
handed over as samples.

The inference contract checks ``reference_speech`` as the ``audio`` kind, which arrives as an
``Audio`` object (8 kHz, mono); ``F5TTSInference`` takes a waveform array. ESPnet3 202611 ships no
F5-TTS runner (its ASR runner does the same conversion for ``speech``), so the recipe carries this one.
"""

from __future__ import annotations

from espnet3.contract.kinds.audio import Audio
from espnet3.systems.base.inference_runner import InferenceRunner


class F5TTSInferenceRunner(InferenceRunner):
    """``reference_speech`` (one ``Audio`` or a list of them) as 1-D float arrays; the rest unchanged."""

    @staticmethod
    def prepare_model_inputs(inputs):
        def samples(value):
            return value.mono().array if isinstance(value, Audio) else value

        inputs = dict(inputs)
        if "reference_speech" in inputs:
            value = inputs["reference_speech"]
            inputs["reference_speech"] = [samples(v) for v in value] if isinstance(value, list) else samples(value)
        return inputs
