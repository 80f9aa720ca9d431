"""The Python front door: ESPnet3 202611's entry points, each one a Prefect flow run (a finished stage: none).

A recipe's ``run.py`` switches its infer and measure stages to Prefect by changing one import::

    from espnet3_prefect import infer, measure    # was: from espnet3.systems.base.inference import infer
                                                   #      from espnet3.systems.base.metric import measure
    infer(inference_config)                        # the flow ``infer``
    results = measure(metrics_config, inference_config=inference_config)

and any provider/runner workload runs as the flow ``run-runner``: :func:`run`, or ``runner(indices)``
on our :class:`~espnet3_prefect.BaseRunner` (this module is the handler it calls; see
:func:`espnet3_prefect.espnet3.runner.set_call_handler`).

Without ``PREFECT_API_URL`` each call starts the embedded Prefect server (127.0.0.1) around itself;
inside a running flow it is a subflow of that flow, on that flow's API. Like the command line, this
is the top layer: the only package module besides ``cli`` that imports the flows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.load import load_config_input
from espnet3_prefect.config.runner_keys import (
    DEFAULT_MAX_FAILED_RATIO,
    DEFAULT_MIN_FREE_MB,
    DEFAULT_PREFETCH,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_DELAY_S,
)
from espnet3_prefect.espnet3.runner import set_call_handler
from espnet3_prefect.execution.process_parallel import DEFAULT_PARALLEL, active_parallel_config
from espnet3_prefect.main_guard import check_main_guard
from espnet3_prefect.pipeline.run_plan import RunPlan, plan_run
from espnet3_prefect.pipeline.runner_job import RunnerJob, importable_from_workers, prepare_job


def plan_infer(config: DictConfig | dict) -> RunPlan:
    """The run plan of ``infer(config)``, every config mistake raised (one line) before anything starts."""
    plan = plan_run(load_config_input(_plain(config)))
    _main_guard("infer()", plan.spec.env if not plan.spec.address else None)
    plan.preflight()
    return plan


def infer(config: DictConfig) -> None:
    """Run inference over every test set of ``config`` and write ``<inference_dir>/<test>/<field>.scp``,
    as ``espnet3.systems.base.inference.infer`` does, as the Prefect flow ``infer``. When every test
    set is already done and verified for this config and code, it returns at once: no server, no
    cluster, no flow run (one INFO line on the ``espnet3_prefect`` logger), as the command line does."""
    infer_planned(config, None)


def infer_planned(config: DictConfig | dict, plan: RunPlan | None) -> None:
    """:func:`infer` with ``plan``, the one :func:`plan_infer` made of this ``config`` already (the
    recipe checks its first stage before its server starts), so that it is built once."""
    plain = _plain(config)
    plan = plan or plan_infer(plain)  # built once, handed to the flow run
    if _settled(plan):
        return
    plan.check_inputs()  # work to do: the demo's data, then input_key
    importable_from_workers()

    def start():
        from espnet3_prefect.flows.infer import infer as infer_flow

        return infer_flow(config=plain, plan=plan)

    from espnet3_prefect.flows.workers import INFER_FORKSERVER_PRELOAD, fork_server_beside

    _on_api(start, starting=fork_server_beside(plan.spec, plan.stages, INFER_FORKSERVER_PRELOAD))


def measure(metrics_config: DictConfig, inference_config: DictConfig | None = None) -> dict:
    """Score every test set and write ``<inference_dir>/metrics.json``, as
    ``espnet3.systems.base.metric.measure`` does; returns ``{metric class path: {test set: result}}``.
    When nothing it was computed from has changed since the last run (config, metric code, every input
    file, metrics.json itself: :mod:`espnet3_prefect.metrics.record`), it returns those results at
    once: no server, no flow run (one INFO line on the ``espnet3_prefect`` logger)."""
    from espnet3_prefect.metrics.record import settled_results

    plain = _plain(metrics_config)
    plain_inference = None if inference_config is None else _plain(inference_config)
    plan = prepare_measure(plain, plain_inference)
    results = settled_results(plan)  # every config mistake was raised above, before this
    if results is not None:
        logging.getLogger("espnet3_prefect").info(
            "measure: nothing to run, %s is up to date (no server started, no flow run)", plan.output
        )
        return results
    importable_from_workers()

    def start():
        from espnet3_prefect.flows.metrics import metrics as metrics_flow

        return metrics_flow(config=plain, inference_config=plain_inference)

    return _on_api(start)


def prepare_measure(metrics_config: DictConfig | dict, inference_config: DictConfig | dict | None = None) -> Any:
    """``metrics.yaml`` validated against the inference config, as ``measure`` validates it (one line
    naming the key) before anything starts."""
    from espnet3_prefect.metrics.prepare import load_any, load_inference_config, prepare_metrics

    plain_inference = None if inference_config is None else _plain(inference_config)
    return prepare_metrics(load_any(_plain(metrics_config)), inference_config=load_inference_config(plain_inference))


def run(
    runner: Any,
    indices: Iterable[int],
    parallel: DictConfig | Mapping | None = None,
    *,
    retries: int = DEFAULT_RETRIES,
    retry_delay_s: float | Iterable[float] = DEFAULT_RETRY_DELAY_S,
    on_error: str = "fail",
    max_failed_ratio: float = DEFAULT_MAX_FAILED_RATIO,
    min_free_mb: float = DEFAULT_MIN_FREE_MB,
    prefetch: int | bool = DEFAULT_PREFETCH,
    max_duration: float | None = None,
) -> Any:
    """Run ``runner`` over ``indices`` as a run of the flow ``run-runner``; return ``runner.merge(...)``.

    ``runner``: any instance with a static or class-level ``forward`` and ESPnet3's attributes
    (``provider``, ``batch_size``, ``output_dir``, ``shard_subdir``, ``resume``) and hooks, e.g. a
    subclass of ``espnet3.parallel.base_runner.BaseRunner``. ``indices``: any ints, in any order
    (each shard keeps its slice of the list, ``forward`` sees them in that order).
    ``parallel``: the ``parallel`` block (default: the one :func:`set_parallel` registered, else
    ``{env: local, n_workers: 1}``). ``retries``/``retry_delay_s`` (per shard task, never for bad
    input), ``on_error`` (``fail`` or ``skip``: failing items listed in ``failures.jsonl``) and
    ``max_failed_ratio``/``min_free_mb``/``prefetch`` mean what the ``runner:`` keys of the infer config mean.
    ``max_duration`` (default: the runner's attribute of that name, else off): batches cut by length
    within each shard, the items' lengths read from ``runner.provider.build_dataset(...)`` here, the
    results handed to the hooks in the list's order (the infer config's ``runner.max_duration`` for a
    runner with its own ``merge``). Everything is checked before a server or a cluster starts.
    """
    if parallel is None:
        parallel = active_parallel_config() or DEFAULT_PARALLEL
    _main_guard("run()", (parallel.get("env") if isinstance(parallel, Mapping) else None) or "local")
    control = {
        "retries": retries,
        "retry_delay_s": retry_delay_s,
        "on_error": on_error,
        "max_failed_ratio": max_failed_ratio,
        "min_free_mb": min_free_mb,
        "prefetch": prefetch,
        "max_duration": max_duration,
    }
    job = prepare_job(runner, indices, parallel, control)
    importable_from_workers()
    return _on_api(lambda: _runner_flow(job)(job=job), starting=_runner_workers_beside(job))


def run_recipe(run: Any) -> list[dict]:
    """A recipe's stages as one run of the flow ``recipe`` (``run``: the
    :class:`~espnet3_prefect.recipe.driver.RecipeRun` :func:`espnet3_prefect.launch` built); returns
    the stage table's rows."""

    def start():
        from espnet3_prefect.flows.recipe import recipe

        flow = recipe.with_options(flow_run_name=run.name)
        return flow(stages=run.stages, configs=run.configs, rerun=run.rerun, prepared=run)

    return _on_api(start)


def call_runner(runner: Any, indices: Iterable[int]) -> Any:
    """``runner(indices)``: in this process without a registered ``parallel`` block, else :func:`run`."""
    config = active_parallel_config()
    _main_guard("runner(indices)", None if config is None else (config.get("env") or "local"))
    if config is None:
        from espnet3_prefect.pipeline.in_process import run_in_process

        return run_in_process(runner, indices)
    return run(runner, indices, parallel=config)


set_call_handler(call_runner)


def _runner_workers_beside(job: RunnerJob) -> Callable[[dict], None] | None:
    """The local workers' fork server, started beside the server's start, for a job with a shard
    to run (a shard without its done marker, or ``resume: false``); None when all are there."""
    from espnet3_prefect.flows.workers import FORKSERVER_PRELOAD, fork_server_beside

    layout = job.stage.layout
    if job.stage.resume and all(layout.done(shard.index).is_file() for shard in job.shards):
        return None
    return fork_server_beside(job.spec, [job.stage], FORKSERVER_PRELOAD)


def _runner_flow(job: RunnerJob):
    from espnet3_prefect.flows.run_runner import run_runner

    return run_runner.with_options(flow_run_name=job.name)


def _on_api(start: Callable[[], Any], starting: Callable[[dict], None] | None = None) -> Any:
    """``start()`` (which imports and calls a flow) on a Prefect API the workers can reach: the running
    flow's when there is one (a subflow), else ``PREFECT_API_URL``, else the embedded server (then
    ``starting`` runs beside its start: :func:`~espnet3_prefect.server.embedded.prefect_api`)."""
    if _in_flow():
        with _api_for_workers():
            return start()
    from espnet3_prefect.server.embedded import prefect_api

    # before the flow module imports prefect, so every thread sees this API
    with prefect_api(starting=starting, watch=True, rerun=_rerun_command()):
        return start()


def _rerun_command() -> str | None:
    """``python run.py ...`` when a script runs this process (a recipe's ``run.py``), else None."""
    import shlex

    script = sys.argv[0] if sys.argv else ""
    return shlex.join(["python", *sys.argv]) if script.endswith(".py") else None


def _settled(plan: RunPlan) -> bool:
    """Whether every test set is already done and verified for this config and code (as the command
    line checks it): then nothing starts, no server, no cluster, no flow run (one log line says so)."""
    if plan.complete() is None:
        return False
    logging.getLogger("espnet3_prefect").info(
        "infer: nothing to run, every test set is done and verified (no server started, no flow run): %s",
        ", ".join(stage.test_set for stage in plan.stages),
    )
    return True


def _plain(config: Any) -> dict:
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    return dict(config)


def _main_guard(what: str, env: str | None) -> None:
    """Local backends spawn worker processes, which re-import the main script: a stage started from
    its unguarded top level stops here on one line (:mod:`espnet3_prefect.main_guard`)."""
    if env in ("local", "local_gpu") or getattr(sys.modules.get("__main__"), "__name__", None) == "__mp_main__":
        check_main_guard(what)


def _in_flow() -> bool:
    if "prefect" not in sys.modules:  # no flow can be running without it
        return False
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


@contextlib.contextmanager
def _api_for_workers() -> Iterator[None]:
    """Inside a flow on Prefect's ephemeral API (no ``PREFECT_API_URL``): workers get that API's URL."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    url = str(getattr(getattr(context, "client", None), "api_url", "") or "")
    if not url:
        yield
        return
    os.environ["PREFECT_API_URL"] = url
    try:
        yield
    finally:
        os.environ.pop("PREFECT_API_URL", None)


def checkpoint_saved(
    path: str | Path,
    *,
    exp_dir: str | Path | None = None,
    state_file: str | Path | None = None,
    api_url: str | None = None,
    latest: bool = False,
) -> str | None:
    """Tell the Prefect server a checkpoint is complete: one ``espnet3.checkpoint.saved`` event, sent and
    confirmed, unless this content was already sent (a copy, a re-save): then nothing, and None.

    Call it after the file is closed (e.g. from a Lightning ``CheckpointIO.save_checkpoint`` override).
    ``exp_dir`` (default: the checkpoint's folder) keys the state file shared with
    ``espnet3-prefect watch-checkpoints``; the server is ``api_url``, else ``$PREFECT_API_URL``, else
    the one ``deploy-local`` left running for this project. ``latest``: a run still queued when a newer
    checkpoint's run is queued behind it passes over (only the newest is evaluated). Returns the event id.
    """
    from espnet3_prefect.checkpoints.checkpoint import checkpoint_info
    from espnet3_prefect.checkpoints.events import EmittedState, prefect_settings, state_path
    from espnet3_prefect.server.registry import find_api

    info = checkpoint_info(path)
    folder = Path(exp_dir).expanduser().resolve() if exp_dir else Path(info["path"]).parent
    if api_url:
        from espnet3_prefect.disk.client_file import ClientCredentials

        creds = ClientCredentials(
            api_url,
            os.environ.get("PREFECT_API_AUTH_STRING") or None,
            ssl_cert_file=os.environ.get("PREFECT_API_SSL_CERT_FILE") or None,
        )
    else:
        creds = find_api(None)
    with prefect_settings(creds), EmittedState(state_path(folder, state_file)) as state:
        state.flush_pending()
        sent = state.emit([info], folder, latest)
    return sent[0]["id"] if sent else None
