"""Flow ``metrics``: score what ``infer`` wrote, per test set, into ``<inference_dir>/metrics.json``.

config -> validate (every metric instantiated, every binding and SCP input checked) ->
dataset-column (each ``dataset:<column>`` of each test set written once) -> score (one task per
metric and test set, streamed) -> metrics.json (ESPnet3 202611's bytes, atomic) + its record (a re-run
with nothing changed starts no flow: espnet3_prefect.metrics.record) -> table artifact.
"""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import DictConfig, OmegaConf
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from espnet3_prefect._internal.util import as_list, is_number
from espnet3_prefect.errors import Espnet3PrefectError, one_line
from espnet3_prefect.execution.run_states import fails_with_its_message, wait_until_recorded
from espnet3_prefect.execution.rundir import enter_workdir, preload_on_main_thread
from espnet3_prefect.metrics.metric_plan import MetricSpec, MetricsPlan
from espnet3_prefect.metrics.prepare import load_any, load_inference_config, prepare_metrics
from espnet3_prefect.metrics.record import write_results
from espnet3_prefect.pipeline.report import quiet_console
from espnet3_prefect.tasks.score import dataset_column, score


@flow(name="metrics", log_prints=True, validate_parameters=True)
@fails_with_its_message
def metrics(
    config: list[str] | str | dict,
    overrides: list[str] | None = None,
    workdir: str | None = None,
    inference_config: list[str] | str | dict | None = None,
    inference_overrides: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the ESPnet3 metrics stage for ``config`` (files merged left to right, then overrides).

    ``inference_config`` (files, then ``inference_overrides``; or a mapping) is the test set
    definition ``dataset:<column>`` inputs read, and gives ``inference_dir`` when the metrics
    config has none. Returns ``{metric key: {test_set: result}}``, the content of ``metrics.json``.

    Example::

        espnet3-prefect metrics --config conf/metrics.yaml --inference-config conf/inference.yaml
    """
    quiet_console()  # one terminal line per task run
    enter_workdir(workdir)
    preload_on_main_thread()  # espnet3's classes import dask_jobqueue, which must happen on the main thread
    cfg = load_any(config if isinstance(config, dict) else as_list(config), as_list(overrides), "config")
    icfg = load_inference_config(inference_config, as_list(inference_overrides))
    plan = prepare_metrics(cfg, inference_config=icfg)  # every config mistake fails here, before any scoring
    logger = get_run_logger()
    logger.info(
        "metrics %s on test sets %s in %s",
        ", ".join(s.label for s in plan.metrics),
        ", ".join(plan.test_sets),
        plan.inference_dir,
    )
    plain_icfg = OmegaConf.to_container(icfg, resolve=True) if isinstance(icfg, DictConfig) else None
    columns = {
        (test_set, column): dataset_column.submit(
            plain_icfg, plan.inference_dir, test_set, column, plan.dataset_artifacts.get(column)
        )
        for test_set, column in plan.dataset_columns()
    }
    futures, waits = {}, {}
    for spec in plan.metrics:
        instances = _instances(spec, len(plan.test_sets))
        previous = None
        for j, test_set in enumerate(plan.test_sets):
            wait = [columns[(test_set, c)] for c in dict.fromkeys(spec.columns())]
            if instances is None and previous is not None:
                wait.append(previous)  # one instance (it cannot be copied): its test sets in turn
            metric = spec.metric if instances is None else instances[j]
            previous = futures[(spec.key, test_set)] = score.submit(
                spec, test_set, plan.inference_dir, metric, wait_for=wait
            )
            waits[(spec.key, test_set)] = wait
    failures, failed = [], set()
    for (test_set, column), future in columns.items():
        try:
            future.result()
        except Exception as exc:
            failed.add(id(future))
            failures.append(f"dataset:{column} of {test_set}: {one_line(exc)}")
    results: dict[str, dict[str, Any]] = {spec.key: {} for spec in plan.metrics}
    for (key, test_set), future in futures.items():
        try:
            results[key][test_set] = future.result()
        except Exception as exc:
            failed.add(id(future))
            if not any(id(w) in failed for w in waits[(key, test_set)]):  # else its input's failure says why
                failures.append(f"{key} on {test_set}: {one_line(exc)}")
    if failures:
        raise Espnet3PrefectError(f"{len(failures)} metric(s) failed: " + "; ".join(failures[:5]))
    write_results(plan, results)  # metrics.json (ESPnet3's bytes, atomic), then the record a re-run checks
    publish_scores(plan, results)
    logger.info("wrote %s\n%s", plan.output, format_scores(plan, results))
    # ended only once the server shows every task run it started (as infer's flow does)
    wait_until_recorded(flow_run.get_id(), len(columns) + len(futures))
    return results


def _instances(spec: MetricSpec, n: int) -> list[Any] | None:
    """One metric instance per test set (metrics keep state while scoring); None if it cannot be copied."""
    try:
        return [spec.metric] + [copy.deepcopy(spec.metric) for _ in range(n - 1)]
    except Exception:
        return None


def score_rows(plan: MetricsPlan, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per metric and test set: the metric's class name, the test set, then its numbers."""
    rows = []
    for spec in plan.metrics:
        for test_set, result in results[spec.key].items():
            row = {"metric": spec.label, "test_set": test_set}
            row.update({k: v for k, v in result.items() if isinstance(v, (int, float, str)) or v is None})
            rows.append(row)
    return rows


def publish_scores(plan: MetricsPlan, results: dict[str, dict[str, Any]]) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        table=score_rows(plan, results),
        key="metrics-scores",
        description=f"metrics of {plan.inference_dir} (percent for WER/CER)",
    )


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
