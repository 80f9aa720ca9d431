"""Flow ``evaluate``: ``infer`` then ``metrics`` (subflows), recorded in a history with a trend.

validate both configs -> model identity -> infer (cached shards are reused) -> metrics ->
append ``<inference_dir>/evaluate_history.jsonl`` -> ``evaluate_history.png`` -> markdown artifact.

A run whose model and config are unchanged since the last evaluation is answered from infer's
shard cache (no shard runs) and says so. When the model is a file (a checkpoint named in the
``model`` block), its content hash joins infer's fingerprint, so a new checkpoint at the same
path re-runs the shards.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from prefect import flow, get_run_logger

from espnet3_prefect._internal.util import as_list
from espnet3_prefect.checkpoints.checkpoint import checkpoint_info, describe_checkpoint, resolve_key
from espnet3_prefect.checkpoints.trend import (
    CHECKPOINT_PLOT_FILE,
    already_scored,
    checkpoint_markdown,
    checkpoint_points,
    write_checkpoint_plot,
)
from espnet3_prefect.config.load import fingerprint, identity_config, load_config
from espnet3_prefect.config.precheck import check_inputs_before_start
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.run_states import fails_with_its_message
from espnet3_prefect.execution.rundir import enter_workdir, preload_on_main_thread
from espnet3_prefect.execution.spec import preflight
from espnet3_prefect.flows.infer import infer
from espnet3_prefect.flows.metrics import headline, metrics
from espnet3_prefect.metrics.history import (
    HISTORY_FILE,
    PLOT_FILE,
    append_history,
    describe_model,
    model_identity,
    now_utc,
    read_history,
    trend_markdown,
    write_plot,
)
from espnet3_prefect.metrics.prepare import prepare_metrics
from espnet3_prefect.pipeline.report import quiet_console
from espnet3_prefect.pipeline.stage import prepare_stages

MODEL_ID_KEY = "evaluate_model_id"


def plan_evaluation(
    infer_config,
    metrics_config,
    infer_overrides=None,
    metrics_overrides=None,
    checkpoint: str | None = None,
    checkpoint_key: str | None = None,
) -> dict:
    """Load and validate both configs (nothing runs); fill the metrics config from the inference one.

    The metrics config may omit ``inference_dir`` and ``dataset.test``: they come from the
    inference config. A different ``inference_dir`` is an error. With ``checkpoint``, its path
    fills ``checkpoint_key`` of the inference config (:func:`~espnet3_prefect.checkpoints.checkpoint.resolve_key`)
    and the config fingerprint is taken without it (the same config across checkpoints).
    """
    infer_overrides = list(as_list(infer_overrides))
    ckpt = None
    if checkpoint:
        ckpt = checkpoint_info(checkpoint)
        ckpt["key"] = resolve_key(load_config(as_list(infer_config), infer_overrides), checkpoint_key)
        present = (
            OmegaConf.select(load_config(as_list(infer_config), infer_overrides), ckpt["key"], default="__absent__")
            != "__absent__"
        )
        # quoted: a path is a string whatever YAML would make of it (``1200``, ``a: b``)
        infer_overrides.append(f"{'' if present else '+'}{ckpt['key']}={json.dumps(ckpt['path'])}")
    icfg = load_config(as_list(infer_config), as_list(infer_overrides))
    spec, stages = prepare_stages(icfg)
    preflight(spec)
    check_inputs_before_start(icfg, stages)  # the demo's data, then input_key: before a server starts
    inference_dir = Path(str(icfg.inference_dir)).expanduser().resolve()
    m_overrides = list(as_list(metrics_overrides))
    probe = load_config(as_list(metrics_config), m_overrides)
    if not probe.get("inference_dir"):
        m_overrides.append(f"+inference_dir={inference_dir}")
    elif Path(str(probe.inference_dir)).expanduser().resolve() != inference_dir:
        raise ConfigError(
            f"inference_dir: the metrics config reads {probe.inference_dir} but infer writes "
            f"{icfg.inference_dir}; drop it from the metrics config or make them equal"
        )
    if probe.get("dataset") is None or probe.dataset.get("test") is None:
        # ESPnet3's measure() without dataset.test scores inference_dir's folders sorted by name:
        # the same order here, so metrics.json has upstream's bytes whichever stage writes it.
        names = ", ".join(f"{{name: {name}}}" for name in sorted(s.test_set for s in stages))
        m_overrides.append(f"+dataset.test=[{names}]")
    mcfg = load_config(as_list(metrics_config), m_overrides)
    mplan = prepare_metrics(mcfg, inference_config=icfg, check_inputs=False)  # dataset: inputs read icfg
    identity = model_identity(icfg)
    i_overrides = list(as_list(infer_overrides))
    if identity["kind"] == "files":  # the checkpoint's content joins infer's fingerprint
        i_overrides.append(f"+{MODEL_ID_KEY}={identity['id']}")
    infer_identity = identity_config(icfg)
    if ckpt is not None:
        _drop(infer_identity, ckpt["key"])
    return {
        "inference_dir": inference_dir,
        "infer_overrides": i_overrides,
        "metrics_overrides": m_overrides,
        "identity": identity,
        "metrics_plan": mplan,
        "checkpoint": ckpt,
        "config_fingerprint": fingerprint({"infer": infer_identity, "metrics": mplan.fingerprint}),
    }


def _drop(data: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data.get(key) if isinstance(data, dict) else None
    if isinstance(data, dict):
        data.pop(leaf, None)


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
) -> dict[str, Any]:
    """Evaluate a model: infer (subflow), metrics (subflow), history, trend artifact and plot.

    ``checkpoint``: a checkpoint file to evaluate; its path fills ``checkpoint_key`` of the inference
    config (default: the recipe's, e.g. ``model.asr_model_file``; the demo's ``model.model_file``).
    Its path, sha256, epoch and step are recorded with the scores, and a checkpoint already scored
    with this config is not decoded again (the run returns that record). ``checkpoint_sha256``: the
    hash the checkpoint event announced (a file changed since is evaluated as it is now, with a warning).
    ``latest_only`` (``watch-checkpoints --mode latest``): when a newer run of this deployment with
    ``latest_only`` exists (queued behind this one, or already running or done), this one passes over
    its checkpoint (nothing decoded, no history line).

    Returns this run's history record. Example::

        espnet3-prefect evaluate --config recipes/dtmf/conf/inference.yaml \\
            --metrics-config recipes/dtmf/conf/metrics.yaml
    """
    quiet_console()  # one terminal line per task run
    enter_workdir(workdir)
    preload_on_main_thread()  # espnet3's classes import dask_jobqueue, which must happen on the main thread
    plan = plan_evaluation(infer_config, metrics_config, infer_overrides, metrics_overrides, checkpoint, checkpoint_key)
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
    summaries = infer(config=infer_config, overrides=plan["infer_overrides"])
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
        "flow_run_id": _flow_run_id(),
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


def newer_run() -> str | None:
    """The name of a run of this run's deployment created after it with ``latest_only``, queued, running
    or done (not failed or cancelled): this run's checkpoint is not the newest any more."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    with get_client(sync_client=True) as client:
        me = client.read_flow_run(flow_run.id)
        if me.deployment_id is None:
            return None
        waiting = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[me.deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(
                        any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.COMPLETED]
                    )
                )
            ),
        )
    newer = [r for r in waiting if r.id != me.id and r.parameters.get("latest_only") and r.created > me.created]
    return max(newer, key=lambda r: r.created).name if newer else None


def label_run(ckpt: dict) -> None:
    """Name this flow run after the checkpoint and tag it, so the UI groups a checkpoint's runs."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    tags = ["checkpoint", f"checkpoint:{ckpt['name']}", f"sha256:{ckpt['sha256'][:12]}"]
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        client.update_flow_run(
            flow_run.id,
            name=f"evaluate-{ckpt['name']}-{ckpt['sha256'][:8]}",
            tags=sorted(set(current.tags) | set(tags)),
        )


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


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None
