"""Flow ``recipe``: a whole ESPnet3 recipe as one flow run, its stages as children in ESPnet3's order.

stages resolved by ESPnet3's launcher -> for each: done? (the stage rule) -> Cached task run, or run:
ESPnet3's own stages as task runs (``create_dataset``, ``train_tokenizer``, ``train``, ...), ours as the
subflow runs they are (``infer``, ``metrics``, ``collect_stats``' ``run-runner``s) -> the stage table
artifact, with the scores ``measure`` wrote. The loop itself is :func:`espnet3_prefect.recipe.driver.drive_recipe`.

Example, in ESPnet's ``egs3/mini_an4/esp2_asr`` (``python run.py`` with our ``launch`` does the same)::

    espnet3-prefect run --stages all --training_config conf/training.yaml \\
        --inference_config conf/inference.yaml --metrics_config conf/metrics.yaml
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled

from espnet3_prefect._internal.util import put_on_pythonpath
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.cancel_watch import CancelWatch, mark_cancelled
from espnet3_prefect.execution.cluster import cancel_jobs_hook
from espnet3_prefect.execution.run_states import fails_with_its_message
from espnet3_prefect.execution.rundir import enter_workdir
from espnet3_prefect.execution.stage_job import JobCancelled
from espnet3_prefect.recipe.driver import RecipeRun, StageFailed, StageInterrupted, StageRow, drive_recipe
from espnet3_prefect.recipe.launcher import recipe_from_parameters
from espnet3_prefect.recipe.placement import place as place_stages
from espnet3_prefect.recipe.system import folder, log_dir_of
from espnet3_prefect.recipe.table import PREFECT_STAGES
from espnet3_prefect.tasks.stage import cached_stage, run_stage, stage_logs_to_prefect


class PrefectStages:
    """The driver's executor: a stage as a task run (ESPnet3's) or in this flow run (ours: their flows
    are subflow runs of it); a done stage as a task run in the Cached state."""

    def __init__(self, run: RecipeRun):
        self.recipe_run = run
        self.here: str | None = None  # the stage running in this process now (not as a job)

    def cached(self, stage: str, reason: str) -> None:
        cached_stage.with_options(task_run_name=stage)(stage, reason)

    def run(self, stage: str, call: Any, why: str) -> None:
        from espnet3_prefect.execution.api_reach import wait_until_up

        # A stage starts its task or subflow run on the server: after an outage, once the server answers
        # (the work of a stage already running goes on meanwhile; past parallel.api_outage_s the watch
        # ends the run)
        wait_until_up()
        get_run_logger().info("%s: runs (%s); its log: %s", stage, why, stage_log(self.recipe_run, stage))
        self.here = None if stage in self.recipe_run.placed else stage
        try:
            if stage in PREFECT_STAGES:
                with stage_logs_to_prefect(stage):
                    call()
            else:
                state = run_stage.with_options(task_run_name=stage)(stage, call, return_state=True)
                if state.is_cancelled():
                    raise JobCancelled(state.message or f"{stage} cancelled")
                state.result()  # the stage's own error, when it failed
        finally:
            self.here = None

    def interrupt(self) -> None:
        """A cancel: stop the stage running in this process as Ctrl-C would, a KeyboardInterrupt raised in
        the main thread (asynchronously: also where SIGINT is ignored, as in a test runner's worker);
        a placed stage's job is cancelled by its own wait, which watches the same event."""
        if self.here is not None:
            import ctypes

            main = ctypes.c_ulong(threading.main_thread().ident)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(main, ctypes.py_object(KeyboardInterrupt))


@flow(name="recipe", log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
@fails_with_its_message
def recipe(
    stages: list[str],
    configs: dict[str, str],
    rerun: list[str] | None = None,
    system: str | None = None,
    workdir: str | None = None,
    place: dict[str, dict] | None = None,
    prepared: Any = None,
) -> list[dict]:
    """Run ``stages`` of the recipe in the folder ``workdir``: ESPnet3's launcher arguments as
    parameters (``configs``: ``{role: file}``, e.g. ``{"training": "conf/training.yaml"}``; ``system``:
    ``module.Class``, default the system the folder is named after; ``rerun``: stages to rerun).
    ``place``: where stages run, beside the configs, ``{stage: parallel-shaped block}`` (``train``: one
    job; ``infer``, ``collect_stats``: their ``parallel`` block; see :func:`~espnet3_prefect.recipe.placement.place`).
    ``prepared``: the :class:`~espnet3_prefect.recipe.driver.RecipeRun` a front door in this process
    built from the same arguments (recorded as ``<RecipeRun ...>``); without it (a deployment's run)
    the flow builds it, in ``workdir``."""
    if not isinstance(prepared, RecipeRun):
        if not workdir:
            raise ConfigError("workdir: give the recipe folder (the one holding run.py and conf/)")
        # as `python run.py` has it there: the recipe's own `src` before the TEMPLATE's
        put_on_pythonpath(enter_workdir(workdir), first=True)
        prepared = recipe_from_parameters(stages, configs, rerun or [], system)
    place_stages(prepared, place)
    executor = PrefectStages(prepared)
    watch = CancelWatch(flow_run.id, on_cancel=executor.interrupt)
    prepared.stop = watch.event
    try:
        with watch:
            rows = drive_recipe(prepared, executor)
    except StageFailed as exc:
        prepared.rows = exc.rows
        publish_stage_table(prepared, exc.rows)
        raise
    except StageInterrupted as exc:
        prepared.rows = exc.rows
        publish_stage_table(prepared, exc.rows)
        if not watch.event.is_set():
            raise  # Ctrl-C
        message = f"cancelled ({watch.by!r}) during {exc.stage}; finished stages stay done, a re-run resumes"
        mark_cancelled(flow_run.id, message)
        return Cancelled(message=message)
    prepared.rows = rows
    publish_stage_table(prepared, rows)
    return [row.to_dict() for row in rows]


def publish_stage_table(run: RecipeRun, rows: list[StageRow]) -> None:
    """The stage table (stage, state, seconds, outputs, why) and the scores of ``measure``, as one
    markdown artifact of the recipe's flow run."""
    from prefect.artifacts import create_markdown_artifact

    lines = ["| stage | state | seconds | node-hours | outputs | why | log |", "|---|---|---:|---:|---:|---|---|"]
    for row in rows:
        seconds = "" if row.seconds is None else f"{row.seconds:.1f}"
        node_hours = "" if row.node_hours is None else f"{row.node_hours:.4f}"
        outputs = "" if row.outputs is None else str(row.outputs)
        why = row.why.replace("|", "/")
        log = f"`{stage_log(run, row.stage)}`"
        lines.append(f"| {row.stage} | {row.state} | {seconds} | {node_hours} | {outputs} | {why} | {log} |")
    scores = _scores(run)
    if scores:
        lines += ["", "**Scores** (`measure`)", "", "| metric | test set | value |", "|---|---|---|"]
        lines += [f"| {metric} | {test_set} | {value} |" for metric, test_set, value in scores]
    create_markdown_artifact(
        markdown="\n".join(lines), key="recipe-stages", description=f"{run.name}: each stage of this run"
    )


def stage_log(run: RecipeRun, stage: str) -> str:
    """The stage's ``<stage>.log`` (ESPnet3's, in the stage's folder), relative to the recipe folder."""
    path = log_dir_of(run.system, stage) / f"{stage}.log"
    rel = os.path.relpath(path.absolute(), run.root.absolute())
    return str(path) if rel.startswith("..") else rel


def _scores(run: RecipeRun) -> list[tuple[str, str, str]]:
    """``(metric, test set, value)`` from the inference folder's ``metrics.json``, when ``measure`` is
    a stage of this run and the file is there."""
    if "measure" not in run.stages:
        return []
    where = folder(run.system, "measure", "inference_dir")
    path = Path(where) / "metrics.json" if where is not None else None
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None else {}
    except (OSError, ValueError):
        return []
    rows = []
    for metric, per_test in data.items():
        for test_set, value in per_test.items() if isinstance(per_test, dict) else []:
            rows.append((metric.rsplit(".", 1)[-1], test_set, json.dumps(value)))
    return rows


__all__ = ["PrefectStages", "publish_stage_table", "recipe"]
