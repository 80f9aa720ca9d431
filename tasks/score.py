"""Task ``score``: one metric on one test set, streamed over the SCP files infer wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from espnet3_prefect.errors import BadInputError
from espnet3_prefect.scp import ScpField, count_aligned


@task(name="score", task_run_name="score-{spec.label}-{test_set}", cache_policy=NO_CACHE, retries=0)
def score(spec, test_set: str, inference_dir: Path) -> dict:
    """Check that the inputs list the same utt_ids in the same order, then call the metric.

    Returns the metric's result (a JSON-serializable dict).
    """
    logger = get_run_logger()
    started = time.perf_counter()
    paths = spec.input_paths(Path(inference_dir), test_set)
    n_utts = count_aligned(paths)
    if n_utts == 0:
        raise BadInputError(f"test set {test_set!r}: {', '.join(str(p) for p in paths.values())} are empty")
    data = {alias: ScpField(path) for alias, path in paths.items()}
    result = spec.metric(data, test_set, Path(inference_dir))
    if not isinstance(result, dict):
        raise BadInputError(f"metric {spec.key}: returned {type(result).__name__}, expected a dict of results")
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise BadInputError(f"metric {spec.key}: result is not JSON-serializable: {exc}") from None
    logger.info("%s on %s: %d utterances in %.2f s: %s", spec.label, test_set, n_utts,
                time.perf_counter() - started, result)
    return result
