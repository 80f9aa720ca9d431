"""The metrics stage's config (ESPnet3 202611's ``metrics.yaml``), validated before anything is scored::

    inference_dir: exp/asr/inference          # where infer wrote <test>/<field>.scp; else the
                                              # inference config's inference_dir
    dataset: {test: [{name: test_clean}]}     # optional: else every non-hidden folder, sorted
    dataset_artifacts:                        # optional: how a dataset: column that is not a
      speech: {type: wav, sample_rate: 16000} # scalar is written (infer's output_artifacts form)
    metrics:
      - metric: {_target_: espnet3.systems.esp2_asr.metrics.wer.WER, clean_types: null}
        inputs: {ref: dataset:text, hyp: text}

``inputs:`` binds each input a metric declares to a source: an SCP stem (``hyp: text`` reads
``<inference_dir>/<test>/text.scp``) or ``dataset:<column>``, the test set's own column, written
once to ``<inference_dir>/<test>/dataset/<column>.scp`` (see
:func:`~espnet3_prefect.metrics.dataset_columns.dataset_column_scp`) and
reused afterwards. A ``dataset:`` input needs the inference config (the test set definition).

A metric that declares ``inputs``/``outputs`` (ESPnet3's ``BaseMetric`` contract) must bind them
and gets ``{name: Path}``; any other callable ``metric(data, test_name, inference_dir)`` is our
extension: it gets :class:`~espnet3_prefect._internal.scp.ScpField` values, and its ``inputs:`` may be
omitted when it has ``ref_key``/``hyp_key`` attributes.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from espnet3_prefect.config.keys import METRICS_KEYS, check_top_level_keys
from espnet3_prefect.config.load import fingerprint, load_config_input
from espnet3_prefect.config.targets import espnet3_installed, instantiate, locate, resolve_target
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.metrics import class_path
from espnet3_prefect.metrics.dataset_columns import materializer, provider_class, source_path
from espnet3_prefect.metrics.metric_contract import DATASET_PREFIX, check_metric_contract, check_metric_inputs
from espnet3_prefect.metrics.metric_plan import MetricSpec, MetricsPlan

ENTRY_KEYS = ("metric", "inputs")
TER_TARGET = "espnet3.systems.esp2_asr.metrics.ter.TER"


# -- loading ---------------------------------------------------------------------------------------


def load_any(source: Any, overrides: Any = (), what: str = "config") -> DictConfig:
    """A config from file paths (merged left to right, then ``key=value`` overrides) or a mapping."""
    overrides = [overrides] if isinstance(overrides, str) else list(overrides or [])
    if isinstance(source, (dict, DictConfig)) and overrides:
        raise ConfigError(f"{what}: key=value overrides need config files, not a mapping; apply them to the mapping")
    return load_config_input(source, overrides)


def load_inference_config(source: Any, overrides: Any = ()) -> DictConfig | None:
    """The inference config ``dataset:`` inputs need (``None`` when not given)."""
    if source is None or (isinstance(source, (list, tuple)) and not source):
        if overrides:
            raise ConfigError("inference_overrides: given without an inference config")
        return None
    return load_any(source, overrides, "inference_config")


# -- validation ------------------------------------------------------------------------------------


def _check_source(source: str, where: str) -> None:
    if source.startswith(DATASET_PREFIX):
        column = source[len(DATASET_PREFIX) :]
        if not column or "/" in column or "\\" in column or column.startswith(".") or column != column.strip():
            raise ConfigError(f"{where}: {source!r} must name one column, like dataset:text")
        return
    parts = PurePosixPath(source).parts
    if source.startswith("/") or ".." in parts or source != source.strip():
        raise ConfigError(f"{where}: {source!r} must be an SCP stem inside the test set's folder, like 'text'")


def _legacy_bindings(raw: Any, metric: Any, block: DictConfig, where: str) -> dict[str, str]:
    """Bindings of a plain callable metric (our extension): a mapping, a list, or ref_key/hyp_key."""
    if raw is None:
        ref = block.get("ref_key", getattr(metric, "ref_key", None))
        hyp = block.get("hyp_key", getattr(metric, "hyp_key", None))
        if not ref or not hyp:
            raise ConfigError(
                f"{where}.inputs: missing; bind the metric's inputs, e.g. {{ref: dataset:text, hyp: text}}"
            )
        raw = [ref, hyp]
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, (ListConfig, list, tuple)):
        if not raw:
            raise ConfigError(f"{where}.inputs: empty list")
        bindings = {str(n): n for n in raw}
    elif isinstance(raw, (DictConfig, dict)):
        if not raw:
            raise ConfigError(f"{where}.inputs: empty mapping")
        bindings = {str(k): v for k, v in raw.items()}
    else:
        raise ConfigError(f"{where}.inputs: must map input names to sources or list them, got {raw!r}")
    for name, source in bindings.items():
        if not isinstance(source, str) or not source or source == DATASET_PREFIX:
            raise ConfigError(f"{where}.inputs.{name}: {source!r} must be an SCP stem like 'text' or dataset:<column>")
    for attr in ("ref_key", "hyp_key"):
        wanted = getattr(metric, attr, None)
        if isinstance(wanted, str) and wanted not in bindings:
            raise ConfigError(f"{where}: {attr} {wanted!r} is not among its inputs ({', '.join(bindings)})")
    return bindings


def _instantiate_metric(block: DictConfig, target: str, where: str) -> Any:
    if target == TER_TARGET and not espnet3_installed():
        raise ConfigError(
            f"{where}.metric._target_: {TER_TARGET} needs espnet3 installed (pip install "
            "espnet==202611 sentencepiece): it tokenizes with espnet2's SentencepiecesTokenizer; "
            "WER and CER run without it"
        )
    cls = locate(target, f"{where}.metric._target_")
    check = getattr(cls, "check_clean_types", None)
    if callable(check) and "clean_types" in block:
        try:
            check(OmegaConf.to_container(block, resolve=True).get("clean_types"))
        except ConfigError as exc:
            raise ConfigError(f"{where}.metric.{exc}") from None
    try:
        return instantiate(block)
    except ConfigError as exc:
        raise ConfigError(f"{where}.metric: {exc}") from None


def _metric_specs(cfg: DictConfig) -> list[MetricSpec]:
    entries = cfg.get("metrics")
    if entries is None:
        raise ConfigError("metrics: missing; list them as [{metric: {_target_: ...}, inputs: {...}}, ...]")
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
        metric = _instantiate_metric(block, target, where)
        if not callable(metric):
            raise ConfigError(
                f"{where}.metric._target_: {target!r} is not callable as metric(data, test_name, inference_dir)"
            )
        raw = entry.get("inputs")
        raw = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, (DictConfig, ListConfig)) else raw
        declared = hasattr(metric, "inputs") or hasattr(metric, "outputs")
        if declared:
            try:
                check_metric_contract(metric)
            except ConfigError as exc:
                raise ConfigError(f"{where}.metric: {exc}") from None
            bindings = check_metric_inputs(metric, raw, f"{where}.inputs")
        else:
            bindings = _legacy_bindings(raw, metric, block, where)
        for name, source in bindings.items():
            _check_source(source, f"{where}.inputs.{name}")
        # ESPnet3 keys results by the instance's class path; an ESPnet3 path served by our class
        # keeps its configured name, which is the key ESPnet3 itself would write.
        key = target if resolve_target(target) != target else class_path(metric)
        clash = next((s for s in specs if s.key == key), None)
        if clash is not None:
            raise ConfigError(
                f"{where}.metric._target_: {key!r} is also metrics[{clash.index}]; metrics.json "
                "keys results by class, so list each class once"
            )
        specs.append(MetricSpec(i, key, type(metric).__name__, metric, bindings, declared))
    return specs


def _test_sets(cfg: DictConfig, inference_dir: Path, check_inputs: bool) -> list[str]:
    tests = OmegaConf.select(cfg, "dataset.test")
    if tests:  # ESPnet3: the listed names, as given
        if not isinstance(tests, ListConfig):
            raise ConfigError("dataset.test: must be a list of {name: ...} entries")
        names = []
        for i, entry in enumerate(tests):
            name = entry.get("name") if isinstance(entry, DictConfig) else None
            if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
                raise ConfigError(f"dataset.test[{i}].name: {name!r} must be a test set folder name")
            if name in names:
                raise ConfigError(f"dataset.test[{i}].name: duplicate test set name {name!r}")
            names.append(name)
        return names
    if not check_inputs:
        return []
    names = sorted(p.name for p in inference_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise ConfigError(
            f"inference_dir: {inference_dir} has no test set folders; run infer first or list dataset.test"
        )
    return names


def prepare_metrics(
    cfg: DictConfig, *, inference_config: DictConfig | None = None, check_inputs: bool = True
) -> MetricsPlan:
    """Validate a metrics config; with ``check_inputs``, every SCP input must exist.

    ``check_inputs=False`` validates all that does not depend on infer's outputs (``evaluate``, before infer runs).
    """
    check_top_level_keys(cfg, METRICS_KEYS)  # a misspelt key first: it explains what fails after it
    raw_dir = cfg.get("inference_dir")
    if not raw_dir and inference_config is not None:
        raw_dir = inference_config.get("inference_dir")
    if not raw_dir:
        raise ConfigError(
            "inference_dir: missing; set the folder infer wrote its <test_set>/*.scp into "
            "(or pass the inference config)"
        )
    inference_dir = Path(str(raw_dir)).expanduser().resolve()
    specs = _metric_specs(cfg)
    artifacts = cfg.get("dataset_artifacts") or {}
    if not isinstance(artifacts, (DictConfig, dict)):
        raise ConfigError(f"dataset_artifacts: must map a column to its writer settings, got {artifacts!r}")
    artifacts = OmegaConf.to_container(artifacts, resolve=True) if isinstance(artifacts, DictConfig) else artifacts
    if check_inputs and not inference_dir.is_dir():
        raise ConfigError(f"inference_dir: {inference_dir} does not exist; run infer first")
    test_sets = _test_sets(cfg, inference_dir, check_inputs)
    uses_dataset = [s for s in specs if s.columns()]
    if uses_dataset and inference_config is not None:
        provider_class(inference_config)
        # imported here, on the caller's thread: ESPnet3's writer pulls in dask_jobqueue, whose
        # import installs a signal handler and fails in the worker threads tasks run in
        materializer()
    for spec in uses_dataset if inference_config is None else ():
        for name, source in spec.bindings.items():
            if not source.startswith(DATASET_PREFIX):
                continue
            written = check_inputs and all(source_path(inference_dir, t, source).is_file() for t in test_sets)
            if not written:  # a column written by an earlier run is reused without the config
                raise ConfigError(
                    f"metrics[{spec.index}].inputs.{name}: {source!r} needs the inference config "
                    "(the test set definition): pass --inference-config (flow parameter "
                    "inference_config)"
                )
    if check_inputs:
        for test_set in test_sets:
            for spec in specs:
                for name, source in spec.bindings.items():
                    path = source_path(inference_dir, test_set, source)
                    if source.startswith(DATASET_PREFIX) or path.is_file():
                        continue
                    hint = (
                        f"; name the stem {source[:-4]!r}, '.scp' is added"
                        if source.endswith(".scp") and path.with_name(source).is_file()
                        else f"; run infer for {test_set!r} first or fix it"
                    )
                    raise ConfigError(f"metrics[{spec.index}].inputs.{name}: {path} not found{hint}")
    data = OmegaConf.to_container(cfg, resolve=True)
    data.pop("inference_dir", None)
    return MetricsPlan(inference_dir, test_sets, specs, fingerprint(data), inference_config, artifacts)


__all__ = ["load_any", "load_inference_config", "prepare_metrics"]
