"""Flow ``metrics``: score what ``infer`` wrote, per test set, into ``<inference_dir>/metrics.json``.

config -> validate (every metric instantiated, every input SCP present) -> score (one task per
metric and test set, streamed) -> metrics.json (ESPnet3's layout, atomic) -> table artifact.
"""

from __future__ import annotations

import json
from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect.atomic import atomic_write_text
from espnet3_prefect.config import load_config
from espnet3_prefect.errors import Espnet3PrefectError, one_line
from espnet3_prefect.metrics_stage import MetricsPlan, prepare_metrics
from espnet3_prefect.rundir import enter_workdir
from espnet3_prefect.tasks.score import score
from espnet3_prefect.util import as_list, is_number


@flow(name="metrics", log_prints=True, validate_parameters=True)
def metrics(config: list[str] | str, overrides: list[str] | None = None,
            workdir: str | None = None) -> dict[str, dict[str, Any]]:
    """Run the ESPnet3 metrics stage for ``config`` (files merged left to right, then overrides).

    Returns ``{"<module>.<Class>": {test_set: result}}``, the content of ``metrics.json``.

    Example::

        espnet3-prefect metrics --config recipes/dtmf/conf/metrics.yaml
    """
    enter_workdir(workdir)
    cfg = load_config(as_list(config), as_list(overrides))
    plan = prepare_metrics(cfg)  # every config mistake fails here, before anything is scored
    logger = get_run_logger()
    logger.info("metrics %s on test sets %s in %s", ", ".join(s.label for s in plan.metrics),
                ", ".join(plan.test_sets), plan.inference_dir)
    futures = {(spec.key, test_set): score.submit(spec, test_set, plan.inference_dir)
               for spec in plan.metrics for test_set in plan.test_sets}
    results: dict[str, dict[str, Any]] = {spec.key: {} for spec in plan.metrics}
    failures = []
    for (key, test_set), future in futures.items():
        try:
            results[key][test_set] = future.result()
        except Exception as exc:
            failures.append(f"{key} on {test_set}: {one_line(exc)}")
    if failures:
        raise Espnet3PrefectError(f"{len(failures)} metric(s) failed: " + "; ".join(failures[:5]))
    atomic_write_text(plan.output, json.dumps(results, indent=2) + "\n")
    publish_scores(plan, results)
    logger.info("wrote %s\n%s", plan.output, format_scores(plan, results))
    return results


def score_rows(plan: MetricsPlan, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per metric and test set: the headline score, then the other numbers it returned."""
    rows = []
    for spec in plan.metrics:
        for test_set, result in results[spec.key].items():
            row = {"metric": spec.label, "test_set": test_set}
            row.update({k: v for k, v in result.items() if isinstance(v, (int, float, str)) or v is None})
            rows.append(row)
    return rows


def publish_scores(plan: MetricsPlan, results: dict[str, dict[str, Any]]) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(table=score_rows(plan, results), key="metrics-scores",
                          description=f"metrics of {plan.inference_dir} (percent for WER/CER)")


def headline(label: str, result: dict[str, Any]) -> Any:
    """The score a metric is known by: the value under its own name, else its first number."""
    if label in result:
        return result[label]
    return next((v for v in result.values() if is_number(v)), None)


def format_scores(plan: MetricsPlan, results: dict[str, dict[str, Any]]) -> str:
    lines = []
    for spec in plan.metrics:
        for test_set, result in results[spec.key].items():
            lines.append(f"{test_set}: {spec.label} {headline(spec.label, result)}")
    return "\n".join(lines)
