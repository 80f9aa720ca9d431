"""The metrics stage's config (ESPnet3 ``metrics.yaml``), validated before anything is scored.

    inference_dir: exp/dtmf/inference         # where infer wrote <test_set>/<field>.scp
    dataset: {test: [{name: test_clean}]}     # optional: else every non-hidden folder in inference_dir
    metrics:
      - metric: {_target_: espnet3.systems.asr.metrics.wer.WER, ref_key: ref, hyp_key: hyp}
        inputs: {ref: ref, hyp: hyp}          # optional: alias -> scp name (or a list of names)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from .config import fingerprint, list_test_sets
from .errors import ConfigError
from .targets import instantiate, locate

METRICS_FILE = "metrics.json"
ENTRY_KEYS = ("metric", "inputs")


@dataclass
class MetricSpec:
    """One configured metric: its instance, its metrics.json key and its inputs (alias -> scp file)."""

    index: int
    key: str
    label: str
    metric: Any
    inputs: dict[str, str]

    def input_paths(self, inference_dir: Path, test_set: str) -> dict[str, Path]:
        return {alias: inference_dir / test_set / name for alias, name in self.inputs.items()}


@dataclass
class MetricsPlan:
    inference_dir: Path
    test_sets: list[str]
    metrics: list[MetricSpec]
    fingerprint: str

    @property
    def output(self) -> Path:
        return self.inference_dir / METRICS_FILE


def _scp_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name.strip() or "/" in name or name.startswith("."):
        raise ConfigError(f"{where}: {name!r} must be an SCP name like 'hyp' or 'hyp.scp'")
    return name if name.endswith(".scp") else f"{name}.scp"


def _alias(name: str) -> str:
    return name[:-4] if name.endswith(".scp") else name


def _inputs(raw: Any, metric: Any, block: DictConfig, where: str) -> dict[str, str]:
    if raw is None:
        ref = block.get("ref_key", getattr(metric, "ref_key", None))
        hyp = block.get("hyp_key", getattr(metric, "hyp_key", None))
        if not ref or not hyp:
            raise ConfigError(f"{where}.inputs: missing, and the metric has no ref_key/hyp_key to default to")
        raw = [ref, hyp]
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, (ListConfig, list, tuple)):
        if not raw:
            raise ConfigError(f"{where}.inputs: empty list")
        inputs = {_alias(str(n)): _scp_name(n, f"{where}.inputs[{i}]") for i, n in enumerate(raw)}
    elif isinstance(raw, (DictConfig, dict)):
        if not raw:
            raise ConfigError(f"{where}.inputs: empty mapping")
        inputs = {str(a): _scp_name(n, f"{where}.inputs.{a}") for a, n in raw.items()}
    else:
        raise ConfigError(f"{where}.inputs: must be a mapping alias -> scp name or a list of names, got {raw!r}")
    for attr in ("ref_key", "hyp_key"):
        wanted = getattr(metric, attr, None)
        if isinstance(wanted, str) and wanted not in inputs:
            raise ConfigError(f"{where}: {attr} {wanted!r} is not among its inputs ({', '.join(inputs)})")
    return inputs


def _metric_specs(cfg: DictConfig) -> list[MetricSpec]:
    entries = cfg.get("metrics")
    if entries is None:
        raise ConfigError("metrics: missing; list them as [{metric: {_target_: ...}}, ...]")
    if not isinstance(entries, ListConfig) or len(entries) == 0:
        raise ConfigError("metrics: must be a non-empty list of {metric: {_target_: ...}, inputs: ...} entries")
    specs: list[MetricSpec] = []
    for i, entry in enumerate(entries):
        where = f"metrics[{i}]"
        if not isinstance(entry, DictConfig):
            raise ConfigError(f"{where}: must be a mapping with a 'metric' block, got {entry!r}")
        extra = [k for k in entry if k not in ENTRY_KEYS]
        if extra:
            raise ConfigError(f"{where}.{extra[0]}: unknown key; an entry has {' and '.join(ENTRY_KEYS)}")
        block = entry.get("metric")
        if not isinstance(block, DictConfig) or not block.get("_target_"):
            raise ConfigError(f"{where}.metric._target_: missing; name the metric class")
        target = str(block._target_)
        locate(target, f"{where}.metric._target_")
        try:
            metric = instantiate(block)
        except ConfigError as exc:
            raise ConfigError(f"{where}.metric: {exc}") from None
        if not callable(metric):
            raise ConfigError(f"{where}.metric._target_: {target!r} is not callable as metric(data, test_name, inference_dir)")
        key = target
        clash = next((s for s in specs if s.key == key), None)
        if clash is not None:
            raise ConfigError(f"{where}.metric._target_: {key!r} is also metrics[{clash.index}]; "
                              f"metrics.json keys results by class, so list each class once")
        label = getattr(metric, "name", None)
        label = label if isinstance(label, str) and label else target.rpartition(".")[2]
        specs.append(MetricSpec(i, key, label, metric, _inputs(entry.get("inputs"), metric, block, where)))
    return specs


def _test_sets(cfg: DictConfig, inference_dir: Path, check_inputs: bool) -> list[str]:
    if OmegaConf.select(cfg, "dataset.test") is not None:
        return list_test_sets(cfg)
    if not check_inputs:
        return []
    names = sorted(p.name for p in inference_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise ConfigError(f"inference_dir: {inference_dir} has no test set folders; run infer first or list dataset.test")
    return names


def prepare_metrics(cfg: DictConfig, *, check_inputs: bool = True) -> MetricsPlan:
    """Validate a metrics config; with ``check_inputs``, every input SCP must exist.

    ``check_inputs=False`` validates everything that does not depend on infer's outputs (used by
    ``evaluate`` before infer runs).
    """
    raw_dir = cfg.get("inference_dir")
    if not raw_dir:
        raise ConfigError("inference_dir: missing; set the folder infer wrote its <test_set>/*.scp into")
    inference_dir = Path(str(raw_dir)).expanduser().resolve()
    specs = _metric_specs(cfg)
    if check_inputs and not inference_dir.is_dir():
        raise ConfigError(f"inference_dir: {inference_dir} does not exist; run infer first")
    test_sets = _test_sets(cfg, inference_dir, check_inputs)
    if check_inputs:
        for test_set in test_sets:
            for spec in specs:
                for alias, path in spec.input_paths(inference_dir, test_set).items():
                    if not path.is_file():
                        raise ConfigError(f"metrics[{spec.index}] ({spec.label}) input {alias!r}: {path} not found; "
                                          f"run infer for {test_set!r} first or fix inputs")
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("inference_dir", None)
    return MetricsPlan(inference_dir, test_sets, specs, fingerprint(data))
