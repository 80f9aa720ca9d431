"""Flow ``infer``: config -> plan shards -> build env per worker -> run shard -> mark done -> merge -> report.

Tasks run on a prefect-dask ``DaskTaskRunner`` built from the config's ``parallel`` block, so one
flow serves every backend; the block is read at run time, which lets deployments pass configs.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect.cluster import cancel_jobs_hook, open_task_runner
from espnet3_prefect.config import load_config
from espnet3_prefect.errors import ConfigError, Espnet3PrefectError, one_line
from espnet3_prefect.marker import check_marker
from espnet3_prefect.plan import Shard, default_num_shards, plan_shards
from espnet3_prefect.report import Progress, format_summary, publish_summary
from espnet3_prefect.stage import Stage, prepare_stages
from espnet3_prefect.tasks.build_env import build_env
from espnet3_prefect.tasks.mark_done import write_done_marker
from espnet3_prefect.tasks.merge import merge_shards
from espnet3_prefect.tasks.run_shard import marker_expectation, run_shard


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


@flow(name="infer", log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
def infer(config: list[str] | str, overrides: list[str] | None = None) -> list[dict]:
    """Run the ESPnet3 infer stage for every test set of ``config`` (files merged left to right).

    Example (embedded default: a local Prefect server and a local Dask cluster)::

        espnet3-prefect infer --config recipes/dtmf/conf/inference.yaml parallel.n_workers=2
    """
    cfg = load_config(_as_list(config), _as_list(overrides))
    spec, stages = prepare_stages(cfg)
    for stage in stages:
        check_writable(stage.out_dir)
    logger = get_run_logger()
    logger.info("parallel: env=%s n_workers=%d; test sets: %s", spec.env, spec.n_workers,
                ", ".join(s.test_set for s in stages))
    with open_task_runner(spec, log_root=stages[0].out_dir.parent, logger=logger) as runner:
        summaries = [run_test_set(runner, stage) for stage in stages]
    publish_summary(summaries)
    logger.info("summary:\n%s", format_summary(summaries))
    return summaries


def check_writable(out_dir: Path) -> None:
    """Fail before any compute when the output folder cannot be created or written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"inference_dir: cannot write to {out_dir}: {exc.strerror or one_line(exc)}") from None


def run_test_set(runner, stage: Stage) -> dict:
    """Plan, run and merge one test set; returns its summary (counts and seconds, no data)."""
    logger = get_run_logger()
    started = time.perf_counter()
    sized = runner.submit(build_env, {"stage": stage}).result()
    num_shards = stage.num_shards or default_num_shards(sized["n_items"], stage.n_workers)
    shards = plan_shards(stage.test_set, sized["n_items"], num_shards)
    _remove_stale(stage, len(shards))
    force = _shards_to_redo(stage, shards, logger)
    outcome = _run_shards(runner, stage, shards, force)
    outputs = runner.submit(merge_shards, {"stage": stage, "shard_indices": [s.index for s in shards]}).result()
    _forget_env(runner, stage)
    return {"test_set": stage.test_set, "shards": len(shards), "items": sized["n_items"],
            "shards_run": outcome["run"], "shards_cached": outcome["cached"], "jobs": sorted(outcome["jobs"]),
            "seconds": time.perf_counter() - started, "outputs": outputs, "workers": sized["workers"]}


def _shards_to_redo(stage: Stage, shards: list[Shard], logger) -> dict[int, bool]:
    """Which shards must run even if the Prefect cache has a result: marker missing or stale."""
    if not stage.resume:
        logger.info("runner.resume is false: every shard runs")
        return {s.index: True for s in shards}
    force, reasons = {}, []
    for shard in shards:
        reason = check_marker(stage.shard_dir(shard.index), marker_expectation(stage, shard.to_dict()))
        force[shard.index] = reason is not None
        if reason is not None and "no done marker" not in reason:
            reasons.append(reason)
    for reason in reasons[:5]:
        logger.warning("redoing %s", reason)
    done = sum(not f for f in force.values())
    logger.info("%s: %d of %d shards already done", stage.test_set, done, len(shards))
    return force


def _remove_stale(stage: Stage, n_shards: int) -> None:
    """Remove shard folders outside the plan and leftovers of interrupted writes."""
    if not stage.out_dir.exists():
        return
    for path in stage.out_dir.iterdir():
        name = path.name
        beyond = name.startswith("split.") and name[6:].isdigit() and int(name[6:]) >= n_shards
        leftover = name.startswith(".split.") and (".tmp-" in name or ".old-" in name)
        if path.is_dir() and (beyond or leftover):
            shutil.rmtree(path, ignore_errors=True)


def _run_shards(runner, stage: Stage, shards: list[Shard], force: dict[int, bool]) -> dict:
    """Submit every shard, write markers as shards finish, report progress; raise on failures."""
    from distributed import as_completed

    pending, kinds = {}, {}
    for shard in shards:
        task = run_shard.with_options(
            result_storage=stage.cache_dir, refresh_cache=force[shard.index], retries=stage.retries,
            retry_delay_seconds=list(stage.retry_delay_s))
        future = runner.submit(task, {"stage": stage, "shard": shard.to_dict(), "force": force[shard.index]})
        pending[future.wrapped_future.key] = (future, shard)
        kinds[future.wrapped_future.key] = "shard"
    progress = Progress(stage.test_set, len(shards), sum(s.n_items for s in shards))
    counts, failures = {"run": 0, "cached": 0, "jobs": set()}, []
    stream = as_completed([f.wrapped_future for f, _ in pending.values()], loop=runner.client.loop)
    for done in stream:
        future, shard = pending.pop(done.key)
        try:
            result = future.result()
        except Exception as exc:  # failed after retries, or the worker died (KilledWorker)
            failures.append(f"split.{shard.index} items [{shard.start}, {shard.stop}): {type(exc).__name__}: {one_line(exc)}")
            continue
        if kinds[done.key] == "marker":
            progress.advance(shard.n_items)
        elif result.get("reused") or (future.state is not None and future.state.is_completed() and future.state.name == "Cached"):
            counts["cached"] += 1
            progress.advance(shard.n_items)
        else:
            counts["run"] += 1
            counts["jobs"].update(filter(None, [result.get("slurm_job_id") or result.get("sge_job_id")]))  # batch job
            marker = runner.submit(write_done_marker, {"stage": stage, "result": result})
            pending[marker.wrapped_future.key] = (marker, shard)
            kinds[marker.wrapped_future.key] = "marker"
            stream.add(marker.wrapped_future)
    if failures:
        raise Espnet3PrefectError(f"test set {stage.test_set!r}: {len(failures)} shard(s) failed: " + "; ".join(failures[:5]))
    return counts


def _forget_env(runner, stage: Stage) -> None:
    """Drop this test set's env on every worker (frees the model before the next test set)."""
    try:
        runner.client.unregister_worker_plugin(f"espnet3-env-{stage.env_key}")
    except Exception:  # best effort: a worker that left has nothing to free
        pass
