"""A validated metrics stage (:class:`MetricsPlan`, one :class:`MetricSpec` per configured metric, as
:func:`espnet3_prefect.metrics.prepare.prepare_metrics` builds it) and the bytes of ``metrics.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from espnet3_prefect.metrics.dataset_columns import source_path
from espnet3_prefect.metrics.metric_contract import DATASET_PREFIX

METRICS_FILE = "metrics.json"


@dataclass
class MetricSpec:
    """One configured metric: its instance, metrics.json key, and bindings (input name -> source)."""

    index: int
    key: str
    label: str
    metric: Any
    bindings: dict[str, str]
    declared: bool  # ESPnet3's contract: Path inputs, outputs checked

    def input_paths(self, inference_dir: Path, test_set: str) -> dict[str, Path]:
        return {name: source_path(inference_dir, test_set, src) for name, src in self.bindings.items()}

    def columns(self) -> list[str]:
        return [s[len(DATASET_PREFIX) :] for s in self.bindings.values() if s.startswith(DATASET_PREFIX)]


@dataclass
class MetricsPlan:
    inference_dir: Path
    test_sets: list[str]
    metrics: list[MetricSpec]
    fingerprint: str
    inference_config: DictConfig | None = None
    dataset_artifacts: dict = field(default_factory=dict)

    @property
    def output(self) -> Path:
        return self.inference_dir / METRICS_FILE

    def dataset_columns(self) -> list[tuple[str, str]]:
        """``(test_set, column)`` of every ``dataset:`` input, each once, in the order first used."""
        seen: dict[tuple[str, str], None] = {}
        for spec in self.metrics:
            for test_set in self.test_sets:
                for column in spec.columns():
                    seen.setdefault((test_set, column), None)
        return list(seen)


def metrics_json(results: dict) -> str:
    """metrics.json's text, byte for byte what ESPnet3's ``measure()`` writes (``json.dump(results, f,
    indent=2, ensure_ascii=False)``: no final newline)."""
    return json.dumps(results, indent=2, ensure_ascii=False)
