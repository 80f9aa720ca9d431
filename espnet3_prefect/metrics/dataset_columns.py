"""``dataset:<column>`` metric inputs: where a binding's SCP file lies (:func:`source_path`), and a
test set's own column written once as ``<inference_dir>/<test>/dataset/<column>.scp``
(:func:`dataset_column_scp`), the test set built through the inference config's provider.
Moved out of ``metrics/prepare.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect._internal.atomic import atomic_open
from espnet3_prefect._internal.scp import plain_utt_id
from espnet3_prefect.config.targets import locate
from espnet3_prefect.errors import BadInputError, ConfigError
from espnet3_prefect.metrics.metric_contract import DATASET_PREFIX

DATASET_DIR = "dataset"
DEFAULT_PROVIDER = "espnet3.systems.base.inference_provider.InferenceProvider"


def source_path(inference_dir: Path, test_set: str, source: str) -> Path:
    """The SCP file a binding reads for one test set.

    >>> source_path(Path("/x"), "dev", "text").as_posix(), source_path(Path("/x"), "dev", "dataset:text").as_posix()
    ('/x/dev/text.scp', '/x/dev/dataset/text.scp')
    """
    if source.startswith(DATASET_PREFIX):
        return inference_dir / test_set / DATASET_DIR / f"{source[len(DATASET_PREFIX) :]}.scp"
    return inference_dir / test_set / f"{source}.scp"


def provider_class(inference_config: DictConfig, where: str = "provider._target_") -> Any:
    """The class whose static ``build_dataset(config)`` gives a test set (ESPnet3's default provider)."""
    target = OmegaConf.select(inference_config, "provider._target_") or DEFAULT_PROVIDER
    cls = locate(str(target), where)
    if not callable(getattr(cls, "build_dataset", None)):
        raise ConfigError(
            f"{where}: {target!r} has no build_dataset(config); dataset: inputs build the test set through it"
        )
    return cls


# -- dataset: columns ------------------------------------------------------------------------------


def _scalar_only(idx_value: Any, field_key: str, value: Any, output_dir: Path, artifact_config: Any) -> Any:
    if isinstance(value, (str, int, float, bool)):
        return value
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0 and type(value).__module__.startswith("numpy"):
        return item()
    raise BadInputError(
        f"dataset column {field_key!r} of {idx_value!r} holds a {type(value).__name__}: writing "
        "it as an artifact needs espnet3_prefect.espnet3.artifacts or espnet3"
    )


def materializer() -> Callable[..., Any]:
    """How one column value becomes an SCP value: the scalar itself, or the path of an artifact."""
    try:
        from espnet3_prefect.espnet3.artifacts import materialize_output_value  # type: ignore[import-not-found]

        return materialize_output_value
    except ImportError:
        pass
    try:
        from espnet3.systems.base.inference_runner import _materialize_output_value
    except ImportError:
        return _scalar_only

    def upstream(idx_value, field_key, value, output_dir, artifact_config):  # pragma: no cover - needs espnet3
        return _materialize_output_value(
            idx_value=idx_value,
            field_key=field_key,
            value=value,
            output_dir=output_dir,
            artifact_config=artifact_config,
        )

    return upstream


def dataset_column_scp(
    inference_config: DictConfig | dict | None,
    inference_dir: Path,
    test_set: str,
    column: str,
    artifact_config: Any = None,
) -> Path:
    """``<inference_dir>/<test_set>/dataset/<column>.scp``: the test set's own column, one line per item.

    An existing file is reused as is (delete it after changing the dataset). Otherwise the test set
    is built as infer builds it (the provider class's static ``build_dataset(config)`` with
    ``config.test_set`` set), and each item gives ``<id> <value>``: the id is the item's
    ``idx_key`` (``utt_id`` by default; the index when absent), a scalar value is written as is,
    anything else as an artifact under ``dataset/<column>/<id>.<ext>`` (``artifact_config``: infer's
    ``output_artifacts`` form). The file is written aside and renamed once complete.
    """
    path = source_path(Path(inference_dir), test_set, DATASET_PREFIX + column)
    if path.is_file():
        return path
    if inference_config is None:
        raise ConfigError(f"dataset:{column} needs the inference config (the test set definition)")
    plain = (
        OmegaConf.to_container(inference_config, resolve=True)
        if isinstance(inference_config, DictConfig)
        else copy.deepcopy(dict(inference_config))
    )
    config = OmegaConf.create(plain)
    OmegaConf.set_struct(config, False)
    config.test_set = test_set
    dataset = provider_class(config).build_dataset(config)
    idx_key = inference_config.get("idx_key", "utt_id")
    materialize = materializer()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as out:
        for idx in range(len(dataset)):
            item = dataset[idx]
            if column not in item:
                raise BadInputError(
                    f"dataset:{column}: item {idx} of test set {test_set!r} has no {column!r}; it has {sorted(item)}"
                )
            utt_id = plain_utt_id(item.get(idx_key, str(idx)), f"test set {test_set!r} item {idx}: {idx_key}")
            value = materialize(utt_id, column, item[column], path.parent, artifact_config)
            text = f"{value}"
            if "\n" in text or "\r" in text:
                raise BadInputError(
                    f"dataset:{column}: the value of {utt_id!r} in test set {test_set!r} holds a "
                    "line break; an SCP line holds one value"
                )
            out.write(f"{utt_id} {text}\n")
    return path


__all__ = ["DATASET_DIR", "dataset_column_scp", "provider_class", "source_path"]
