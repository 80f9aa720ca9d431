"""Flow ``evaluate``: ``infer`` then ``metrics`` (subflows), recorded in a history with a trend.

validate both configs -> model identity -> infer (cached shards are reused) -> metrics ->
append ``<inference_dir>/evaluate_history.jsonl`` -> ``evaluate_history.png`` -> markdown artifact.

A run whose model and config are unchanged since the last evaluation is answered from infer's
shard cache (no shard runs) and says so. When the model is a file (a checkpoint named in the
``model`` block), its content hash joins infer's fingerprint, so a new checkpoint at the same
path re-runs the shards.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect.checkpoints.checkpoint import describe_checkpoint
from espnet3_prefect.checkpoints.evaluation import EvaluationPlan, plan_evaluation
from espnet3_prefect.checkpoints.flow_runs import label_run, newer_run
from espnet3_prefect.checkpoints.trend import (
    CHECKPOINT_PLOT_FILE,
    already_scored,
    checkpoint_markdown,
    checkpoint_points,
    write_checkpoint_plot,
)
from espnet3_prefect.execution.backends.jobs import current_flow_run_id
from espnet3_prefect.execution.run_states import fails_with_its_message
from espnet3_prefect.execution.rundir import enter_workdir, preload_on_main_thread
from espnet3_prefect.flows.infer import infer
from espnet3_prefect.flows.metrics import headline, metrics
from espnet3_prefect.metrics.history import (
    HISTORY_FILE,
    PLOT_FILE,
    append_history,
    describe_model,
    now_utc,
    read_history,
    trend_markdown,
    write_plot,
)
from espnet3_prefect.pipeline.report import quiet_console


@flow(name="evaluate", log_prints=True)
@fails_with_its_message
def evaluate(
    infer_config: list[str] | str,
    metrics_config: list[str] | str,
    infer_overrides: list[str] | None = None,
    metrics_overrides: list[str] | None = None,
    workdir: str | None = None,
    checkpoint: str | None = None,
    checkpoint_key: str | None = None,
    checkpoint_sha256: str | None = None,
    latest_only: bool | None = None,
    plan: Any = None,
) -> dict[str, Any]:
    """Evaluate a model: infer (subflow), metrics (subflow), history, trend artifact and plot.

    ``checkpoint``: a checkpoint file to evaluate; its path fills ``checkpoint_key`` of the inference
    config (default: the recipe's, e.g. ``model.asr_model_file``; the demo's ``model.model_file``).
    Its path, sha256, epoch and step are recorded with the scores, and a checkpoint already scored
    with this config is not decoded again (the run returns that record). ``checkpoint_sha256``: the
    hash the checkpoint event announced (a file changed since is evaluated as it is now, with a warning).
    ``latest_only`` (``watch-checkpoints --mode latest``): when a newer run of this deployment with
    ``latest_only`` exists (queued behind this one, or already running or done), this one passes over
    its checkpoint (nothing decoded, no history line). ``plan``: the
    :class:`~espnet3_prefect.checkpoints.evaluation.EvaluationPlan` a front door in this process made
    for these arguments (recorded as ``"<EvaluationPlan>"``); without it the flow makes its own.

    Returns this run's history record. Example::

        espnet3-prefect evaluate --config recipes/dtmf/conf/inference.yaml \\
            --metrics-config recipes/dtmf/conf/metrics.yaml
    """
    quiet_console()  # one terminal line per task run
    enter_workdir(workdir)
    preload_on_main_thread()  # espnet3's classes import dask_jobqueue, which must happen on the main thread
    asked = (infer_config, metrics_config, infer_overrides, metrics_overrides, checkpoint, checkpoint_key)
    if not (isinstance(plan, EvaluationPlan) and plan.made_for(*asked)):  # none handed over: a deployment's run
        plan = plan_evaluation(*asked)
    logger = get_run_logger()
    out_dir: Path = plan["inference_dir"]
    history_path, plot_path = out_dir / HISTORY_FILE, out_dir / PLOT_FILE
    history = read_history(history_path)
    last = history[-1] if history else None
    identity, fp, ckpt = plan["identity"], plan["config_fingerprint"], plan["checkpoint"]
    if ckpt is not None:
        label_run(ckpt)
        logger.info("checkpoint: %s -> %s", describe_checkpoint(ckpt), ckpt["key"])
        if checkpoint_sha256 and checkpoint_sha256 != ckpt["sha256"]:
            logger.warning(
                "checkpoint %s changed since its event (sha256 %s then, %s now): evaluating it as it is now",
                ckpt["path"],
                checkpoint_sha256[:12],
                ckpt["sha256"][:12],
            )
        newer = newer_run() if latest_only else None
        if newer is not None:
            logger.info("passed over (latest only): run %s is for a newer checkpoint; nothing decoded", newer)
            return {"checkpoint": ckpt, "passed_over_for": newer, "status": f"passed over for run {newer}"}
        done = already_scored(history, ckpt["sha256"], fp)
        if done is not None:
            logger.info(
                "checkpoint %s already scored with this config at %s (flow run %s): nothing decoded",
                ckpt["sha256"][:12],
                done["run_time"],
                done.get("flow_run_id"),
            )
            return {**done, "already_scored": True}
    unchanged = (
        last is not None and last.get("model", {}).get("id") == identity["id"] and last.get("config_fingerprint") == fp
    )
    logger.info("model: %s", describe_model(identity))
    if unchanged:
        logger.info(
            "model and config unchanged since the evaluation of %s: infer answers from its shard cache",
            last["run_time"],
        )
    started, clock = now_utc(), time.monotonic()
    summaries = infer(config=infer_config, overrides=plan["infer_overrides"], plan=plan["run_plan"])
    results = metrics(
        config=metrics_config,
        overrides=plan["metrics_overrides"],
        inference_config=infer_config,
        inference_overrides=plan["infer_overrides"],
    )
    shards_run = sum(s["shards_run"] for s in summaries)
    shards_cached = sum(s["shards_cached"] for s in summaries)
    from_cache = unchanged and shards_run == 0
    status = _status(last, unchanged, from_cache, shards_run, shards_cached)
    logger.info("%s", status)
    labels = {spec.key: spec.label for spec in plan["metrics_plan"].metrics}
    record = {
        "run_time": started,
        "seconds": round(time.monotonic() - clock, 1),
        "inference_dir": str(out_dir),
        "config_fingerprint": fp,
        "model": identity,
        "model_changed": last is None or last.get("model", {}).get("id") != identity["id"],
        "answered_from_cache": from_cache,
        "shards_run": shards_run,
        "shards_cached": shards_cached,
        "flow_run_id": current_flow_run_id(),
        "status": status,
        "scores": results,
        "headline": {
            labels[key]: {test: headline(labels[key], result) for test, result in per_test.items()}
            for key, per_test in results.items()
        },
    }
    if ckpt is not None:
        record["checkpoint"] = ckpt
    append_history(history_path, record)
    records = [*history, record]
    write_plot(records, plot_path)
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        markdown=trend_markdown(records, plot_path, status),
        key="evaluate-trend",
        description=f"evaluate: score trend of {out_dir}",
    )
    logger.info("history: %s (%d runs); plot: %s", history_path, len(records), plot_path)
    if ckpt is not None:
        points = checkpoint_points(records, fp)
        ckpt_plot = out_dir / CHECKPOINT_PLOT_FILE
        write_checkpoint_plot(points, ckpt_plot)
        create_markdown_artifact(
            markdown=checkpoint_markdown(points, record, ckpt_plot),
            key="evaluate-checkpoints",
            description=f"evaluate: scores per checkpoint of {out_dir}",
        )
        logger.info("checkpoint trend: %d checkpoint(s); plot: %s", len(points), ckpt_plot)
    return record


def _status(last: dict | None, unchanged: bool, from_cache: bool, shards_run: int, shards_cached: int) -> str:
    total = shards_run + shards_cached
    if from_cache:
        return (
            f"answered from cache: model and config unchanged since {last['run_time']}; "
            f"infer ran 0 of {total} shards, scores recomputed from the cached outputs"
        )
    if unchanged:
        return (
            f"model and config unchanged since {last['run_time']}, but {shards_run} of {total} shards "
            f"re-ran (their outputs were missing or changed)"
        )
    if last is None:
        return f"first evaluation: infer ran {shards_run} of {total} shards ({shards_cached} reused from cache)"
    return (
        f"model or config changed since {last['run_time']}: infer ran {shards_run} of {total} shards "
        f"({shards_cached} reused from cache)"
    )
