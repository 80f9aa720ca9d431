"""Tasks ``score`` (one metric on one test set) and ``dataset-column`` (a test set's column as an SCP)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from espnet3_prefect._internal.scp import ScpField, count_aligned
from espnet3_prefect.errors import BadInputError
from espnet3_prefect.metrics.dataset_columns import dataset_column_scp
from espnet3_prefect.metrics.metric_contract import check_metric_output


@task(name="dataset-column", task_run_name="dataset-{test_set}-{column}", cache_policy=NO_CACHE, retries=0)
def dataset_column(inference_config, inference_dir: Path, test_set: str, column: str, artifact_config=None) -> str:
    """Write (or reuse) ``<inference_dir>/<test_set>/dataset/<column>.scp``; return its path."""
    started = time.perf_counter()
    path = Path(inference_dir) / test_set / "dataset" / f"{column}.scp"
    existed = path.is_file()
    path = dataset_column_scp(inference_config, Path(inference_dir), test_set, column, artifact_config)
    get_run_logger().info("%s %s in %.2f s", "reused" if existed else "wrote", path, time.perf_counter() - started)
    return str(path)


@task(name="score", task_run_name="score-{spec.label}-{test_set}", cache_policy=NO_CACHE, retries=0)
def score(spec, test_set: str, inference_dir: Path, metric: Any = None) -> dict:
    """Check that the inputs list the same utt_ids in the same order, then call the metric.

    ``metric`` is this task's own instance (a copy of ``spec.metric`` when test sets run in
    parallel; metrics keep state while scoring). A metric with ESPnet3's contract gets
    ``{name: Path}`` and its result is checked against its declared outputs; any other callable
    gets :class:`~espnet3_prefect._internal.scp.ScpField` values. Returns the result (JSON-serializable).
    """
    logger = get_run_logger()
    started = time.perf_counter()
    metric = spec.metric if metric is None else metric
    paths = spec.input_paths(Path(inference_dir), test_set)
    n_utts = count_aligned(paths)  # one line naming the file and the row, before the metric reads anything
    data = dict(paths) if spec.declared else {name: ScpField(path) for name, path in paths.items()}
    result = metric(data, test_set, Path(inference_dir))
    if not isinstance(result, dict):
        raise BadInputError(f"metric {spec.key}: returned {type(result).__name__}, expected a dict of results")
    if spec.declared:
        check_metric_output(metric, result)
    try:
        json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise BadInputError(f"metric {spec.key}: result is not JSON-serializable: {exc}") from None
    logger.info(
        "%s on %s: %d utterances in %.2f s: %s", spec.label, test_set, n_utts, time.perf_counter() - started, result
    )
    return result
