"""Case (e): a backend under a ``contract:``. It is handed the checked ``speech`` (ESPnet3's
``Audio`` at the declared rate) and answers only ``{"text": ...}``, padded and in capitals: the
contract's ``normalize: [strip, to_lower]`` cleans it and the runner attaches ``utt_id``."""

from __future__ import annotations

from typing import Any

from ..models import DigitNet


class ShoutingDigitNet(DigitNet):
    def __call__(self, speech: Any) -> Any:
        if isinstance(speech, list):
            return [{"text": f"  {self.word(s).upper()} \t"} for s in speech]
        return {"text": f"  {self.word(speech).upper()} \t"}
