"""Case (g): an ``InferenceProvider`` subclass overriding both static builders, as ESPnet3's
docs show: ``build_dataset`` keeps every other item of the test set, ``build_model`` builds the
model on the CPU and shifts its answers by ``digit_offset`` from the config."""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate

from ..compat import InferenceProvider


class EveryOther:
    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return (len(self.dataset) + 1) // 2

    def __getitem__(self, idx: int) -> Any:
        return self.dataset[2 * idx]


class MyInferenceProvider(InferenceProvider):
    @staticmethod
    def build_dataset(config):
        organizer = instantiate(config.dataset)
        return EveryOther(organizer.test[config.test_set])

    @staticmethod
    def build_model(config):
        model = instantiate(config.model, device="cpu")
        model.offset = int(config.digit_offset)
        return model


def output_fn(data: Any, model_output: Any, idx: Any) -> Any:
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "hyp": model_output, "position": idx}
