"""Flow ``infer``: config -> plan shards -> build env per worker -> run shard -> mark done -> merge -> report.

Tasks run on a prefect-dask ``DaskTaskRunner`` built from the config's ``parallel`` block, so one
flow serves every backend; the block is read at run time, which lets deployments pass configs.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from prefect import flow, get_run_logger

from espnet3_prefect.execution.cluster import cancel_jobs_hook, open_task_runner
from espnet3_prefect.config.load import load_config_input
from espnet3_prefect.pipeline.dataprep import ensure_prepared
from espnet3_prefect.flows.dispatch import FORKSERVER_PRELOAD, WORKER_PRELOAD, forget_env, run_shards, take_run_lock
from espnet3_prefect.errors import ConfigError, one_line
from espnet3_prefect.pipeline.merge import remove_merged
from espnet3_prefect.pipeline.plan import write_manifest
from espnet3_prefect.pipeline.report import CONSOLE_OFF, format_summary, publish_summary
from espnet3_prefect.pipeline.resume import already_complete, plan_for, remove_stale, shards_to_redo
from espnet3_prefect.execution.rundir import enter_workdir, preload_on_main_thread
from espnet3_prefect.execution.spec import preflight
from espnet3_prefect.pipeline.sizing import Sizing, size_on_driver
from espnet3_prefect.pipeline.stage import Stage, prepare_stages
from espnet3_prefect.tasks.build_env import build_env
from espnet3_prefect.tasks.merge import merge_shards
from espnet3_prefect.execution.run_states import fails_with_its_message


def _importable_by_batch_jobs() -> None:
    """A deployment loads this file as a script module named ``infer``; objects pickled from it refer
    to that module, so batch jobs (which get only the exported PYTHONPATH) must find it too.
    Appended, not prepended, so nothing on the path is shadowed."""
    if __name__ == "espnet3_prefect.flows.infer":
        return
    here = str(Path(__file__).resolve().parent)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, here])


_importable_by_batch_jobs()


@flow(name="infer", log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
@fails_with_its_message
def infer(config: list[str] | str | dict, overrides: list[str] | None = None,
          workdir: str | None = None) -> list[dict]:
    """Run the ESPnet3 infer stage for every test set of ``config``: config files merged left to
    right (or one already-loaded config as a dict), then ``overrides``.

    ``workdir``: run from that folder (relative paths, recipe modules), as deployments do for
    ``espnet3-prefect infer --detach``.

    Example (embedded default: a local Prefect server and a local Dask cluster)::

        espnet3-prefect infer --config recipes/dtmf/conf/inference.yaml parallel.n_workers=2
    """
    enter_workdir(workdir)
    preload_on_main_thread()  # espnet3's classes import dask_jobqueue, which must happen on the main thread
    cfg = load_config_input(config, overrides)
    spec, stages = prepare_stages(cfg)
    preflight(spec)  # local_gpu without GPUs fails here, also when every shard is cached
    for stage in stages:
        check_writable(stage.out_dir, stage.min_free_mb)
    logger = get_run_logger()
    for made in ensure_prepared(cfg):  # e.g. the DTMF demo's audio on a fresh clone
        logger.info("prepared data: %s", made)
    lock = _lock(stages[0].layout.run_lock_dir, logger)
    try:
        logger.info("parallel: env=%s n_workers=%d; test sets: %s", spec.env, spec.n_workers,
                    ", ".join(s.test_set for s in stages))
        summaries = _run_stages(spec, stages, logger)
    finally:
        lock.release()
    publish_summary(summaries)
    logger.info("summary:\n%s", format_summary(summaries), extra=CONSOLE_OFF)  # the CLI prints it on stdout
    return summaries


def _run_stages(spec, stages: list[Stage], logger) -> list[dict]:
    """Run the test sets that need work; a run where none does starts no cluster at all."""
    finished, sizing = {}, {}
    for stage in stages:
        sizing[stage.test_set] = size_on_driver(stage)
        summary, why = already_complete(stage, sizing[stage.test_set])
        finished[stage.test_set] = summary
        if summary:
            logger.info("%s: all %d shards done and verified, merged outputs intact: nothing to run",
                        stage.test_set, summary["shards"])
        else:
            logger.info("%s: to run (%s)", stage.test_set, why)
    todo = [s for s in stages if finished[s.test_set] is None]
    if todo:
        with open_task_runner(spec, log_root=stages[0].layout.inference_dir, logger=logger,
                              worker_preload=WORKER_PRELOAD,
                              forkserver_preload=FORKSERVER_PRELOAD) as runner:
            finished.update({s.test_set: run_test_set(runner, s, sizing[s.test_set]) for s in todo})
    return [finished[s.test_set] for s in stages]


def check_writable(out_dir: Path, min_free_mb: float = 0.0, key: str = "inference_dir") -> None:
    """Fail before any compute when the output folder cannot be written or its disk is (nearly) full
    (``key`` names the setting in the message)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot write to {out_dir}: {exc.strerror or one_line(exc)}") from None
    free_mb = shutil.disk_usage(out_dir).free / 1e6
    if free_mb < min_free_mb:
        raise ConfigError(f"{key}: only {free_mb:.0f} MB free on {out_dir}, runner.min_free_mb asks "
                          f"for {min_free_mb:.0f} MB")


def _lock(inference_dir: Path, logger):
    """Take the output folder's run lock; a killed earlier run's flow run is marked Crashed."""
    return take_run_lock(inference_dir, logger)


def run_test_set(runner, stage: Stage, sizing: Sizing | None = None) -> dict:
    """Plan, run and merge one test set; returns its summary (counts and seconds, no data).

    ``sizing``: the dataset sized on the driver; without it, ``build-env`` sizes it on a worker."""
    logger = get_run_logger()
    started = time.perf_counter()
    sized = runner.submit(build_env, {"work": stage.work, "builder": stage.builder}).result()
    if sizing is not None:
        sized = {**sized, "n_items": sizing.n_items, "dataset_id": sizing.dataset_id}
    stage = stage.with_dataset(sized.get("dataset_id"), sizing.lengths_id if sizing else None)
    shards = plan_for(stage, sized["n_items"], sizing.lengths if sizing else None)
    if sizing is not None and sizing.lengths is not None:
        logger.info("%s: %d shards balanced on the dataset's lengths() (total %.6g)", stage.test_set, len(shards),
                    float(sizing.lengths.sum()))
    layout = stage.layout
    removed = remove_stale(layout, len(shards))
    if removed:
        logger.info("%s: removed shard folders beyond the plan: %s", stage.test_set, ", ".join(removed[:10]))
    write_manifest(layout.manifest, str(getattr(stage.runner, "output_dir", layout.output_dir)), layout.shard_subdir,
                   shards)
    redo = shards_to_redo(stage, shards, logger.info)
    if any(redo.values()):
        stale = remove_merged(layout)
        if stale:
            logger.info("%s: removed stale merged outputs %s", stage.test_set, ", ".join(stale))
    outcome = run_shards(runner, stage, shards, redo)
    outputs = merge_shards(stage, shards, sized["n_items"])
    forget_env(runner, stage.work.env_key)
    return {"test_set": stage.test_set, "shards": len(shards), "items": sized["n_items"],
            "items_run": sum(s.n_items for s in shards if redo.get(s.index)), "shards_run": outcome["run"], "shards_cached": outcome["cached"], "failed": outcome["failed"],
            "jobs": sorted(outcome["jobs"]), "seconds": time.perf_counter() - started, "outputs": outputs,
            "workers": sized["workers"], "timing": outcome["timing"]}
