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
from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect.atomic import file_digest
from espnet3_prefect.cluster import cancel_jobs_hook, open_task_runner
from espnet3_prefect.config import load_config
from espnet3_prefect.dataprep import ensure_prepared
from espnet3_prefect.errors import ConfigError, Espnet3PrefectError, one_line
from espnet3_prefect.lock import acquire
from espnet3_prefect.marker import check_marker
from espnet3_prefect.merge import read_merged_manifest, remove_merged
from espnet3_prefect.plan import Shard, default_num_shards, plan_shards
from espnet3_prefect.rundir import enter_workdir
from espnet3_prefect.report import Progress, format_summary, publish_summary
from espnet3_prefect.run_states import mark_flow_run_crashed, mark_task_run_crashed
from espnet3_prefect.stage import Stage, dataset_id, prepare_stages
from espnet3_prefect.tasks.build_env import build_env
from espnet3_prefect.tasks.mark_done import marker_label, write_done_marker
from espnet3_prefect.tasks.merge import merge_shards
from espnet3_prefect.tasks.run_shard import marker_expectation, run_shard


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


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


@flow(name="infer", log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
def infer(config: list[str] | str, overrides: list[str] | None = None, workdir: str | None = None) -> list[dict]:
    """Run the ESPnet3 infer stage for every test set of ``config`` (files merged left to right).

    ``workdir``: run from that folder (relative paths, recipe modules), as deployments do for
    ``espnet3-prefect infer --detach``.

    Example (embedded default: a local Prefect server and a local Dask cluster)::

        espnet3-prefect infer --config recipes/dtmf/conf/inference.yaml parallel.n_workers=2
    """
    enter_workdir(workdir)
    cfg = load_config(_as_list(config), _as_list(overrides))
    spec, stages = prepare_stages(cfg)
    for stage in stages:
        check_writable(stage.out_dir, stage.min_free_mb)
    logger = get_run_logger()
    for made in ensure_prepared(cfg):  # e.g. the DTMF demo's audio on a fresh clone
        logger.info("prepared data: %s", made)
    lock = _lock(stages[0].out_dir.parent, logger)
    try:
        logger.info("parallel: env=%s n_workers=%d; test sets: %s", spec.env, spec.n_workers,
                    ", ".join(s.test_set for s in stages))
        summaries = _run_stages(spec, stages, logger)
    finally:
        lock.release()
    publish_summary(summaries)
    logger.info("summary:\n%s", format_summary(summaries))
    return summaries


def _run_stages(spec, stages: list[Stage], logger) -> list[dict]:
    """Run the test sets that need work; a run where none does starts no cluster at all."""
    finished = {}
    for stage in stages:
        summary, why = already_complete(stage)
        finished[stage.test_set] = summary
        if summary:
            logger.info("%s: all %d shards done and verified, merged outputs intact: nothing to run",
                        stage.test_set, summary["shards"])
        else:
            logger.info("%s: to run (%s)", stage.test_set, why)
    todo = [s for s in stages if finished[s.test_set] is None]
    if todo:
        with open_task_runner(spec, log_root=stages[0].out_dir.parent, logger=logger) as runner:
            finished.update({s.test_set: run_test_set(runner, s) for s in todo})
    return [finished[s.test_set] for s in stages]


def check_writable(out_dir: Path, min_free_mb: float = 0.0) -> None:
    """Fail before any compute when the output folder cannot be written or its disk is (nearly) full."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"inference_dir: cannot write to {out_dir}: {exc.strerror or one_line(exc)}") from None
    free_mb = shutil.disk_usage(out_dir).free / 1e6
    if free_mb < min_free_mb:
        raise ConfigError(f"inference_dir: only {free_mb:.0f} MB free on {out_dir}, runner.min_free_mb asks "
                          f"for {min_free_mb:.0f} MB")


def _lock(inference_dir: Path, logger):
    """Take the output folder's run lock; a killed earlier run's flow run is marked Crashed."""
    from prefect.runtime import flow_run

    lock = acquire(inference_dir, str(flow_run.id) if flow_run.id else None)
    stale = lock.stale_holder
    if stale:
        logger.warning("took over the lock of a run that is gone (pid %s on %s)", stale.get("pid"), stale.get("host"))
        if stale.get("flow_run_id") and mark_flow_run_crashed(
                stale["flow_run_id"], f"its process (pid {stale.get('pid')} on {stale.get('host')}) is gone"):
            logger.warning("marked the stale flow run %s as Crashed", stale["flow_run_id"])
    return lock


def already_complete(stage: Stage) -> tuple[dict | None, str]:
    """``(summary, "")`` for a test set that needs no work, else ``(None, why)``; no cluster needed.

    Needs: resume on, a merge manifest for this config+code, the dataset (built here, as ESPnet3
    does for its length) of the same size and fingerprint, every shard's marker and files intact,
    and the merged files unchanged.
    """
    started = time.perf_counter()
    manifest = read_merged_manifest(stage.out_dir)
    provider = stage.runner.provider
    if not stage.resume or not manifest or not hasattr(provider, "build_dataset"):
        return None, "not resumable" if not stage.resume else "no finished merge" if not manifest else "no build_dataset"
    if manifest.get("identity_fingerprint") != stage.identity_fingerprint:
        return None, "config or code changed since the last merge"
    dataset = type(provider).build_dataset(provider.config)
    stage = stage.with_dataset(dataset_id(dataset))
    n_items = len(dataset)
    if manifest.get("fingerprint") != stage.fingerprint or manifest.get("n_items") != n_items:
        return None, "the dataset changed since the last merge"
    shards = plan_shards(stage.test_set, n_items, stage.num_shards or default_num_shards(n_items, stage.n_workers))
    if len(shards) != manifest.get("num_shards"):
        return None, "the shard plan changed"
    for shard in shards:
        reason = check_marker(stage.shard_dir(shard.index), marker_expectation(stage, shard.to_dict()))
        if reason is not None:
            return None, reason
    for name, digest in (manifest.get("digests") or {}).items():
        path = Path(manifest["outputs"][name])
        if not path.is_file() or file_digest(path) != digest:
            return None, f"merged output {path.name} changed or is missing"
    return {"test_set": stage.test_set, "shards": len(shards), "items": n_items, "shards_run": 0,
            "shards_cached": len(shards), "failed": manifest.get("failed", 0), "outputs": manifest["outputs"],
            "seconds": time.perf_counter() - started, "workers": 0}, ""


def run_test_set(runner, stage: Stage) -> dict:
    """Plan, run and merge one test set; returns its summary (counts and seconds, no data)."""
    logger = get_run_logger()
    started = time.perf_counter()
    sized = runner.submit(build_env, {"stage": stage}).result()
    stage = stage.with_dataset(sized.get("dataset_id"))
    num_shards = stage.num_shards or default_num_shards(sized["n_items"], stage.n_workers)
    shards = plan_shards(stage.test_set, sized["n_items"], num_shards)
    _remove_stale(stage, len(shards))
    force = _shards_to_redo(stage, shards, logger)
    if any(force.values()):
        removed = remove_merged(stage.out_dir)
        if removed:
            logger.info("%s: removed stale merged outputs %s", stage.test_set, ", ".join(removed))
    outcome = _run_shards(runner, stage, shards, force)
    outputs = runner.submit(merge_shards, {"stage": stage, "shard_indices": [s.index for s in shards],
                                           "n_items": sized["n_items"]}).result()
    _forget_env(runner, stage)
    return {"test_set": stage.test_set, "shards": len(shards), "items": sized["n_items"],
            "shards_run": outcome["run"], "shards_cached": outcome["cached"], "failed": outcome["failed"],
            "jobs": sorted(outcome["jobs"]),
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

    pending: dict = {}
    for shard in shards:
        task = run_shard.with_options(
            result_storage=stage.cache_dir, refresh_cache=force[shard.index], retries=stage.retries,
            retry_delay_seconds=list(stage.retry_delay_s))
        future = runner.submit(task, {"stage": stage, "shard": shard.to_dict(), "force": force[shard.index]})
        pending[future.wrapped_future.key] = ("shard", future, [shard])
    progress = Progress(stage.test_set, len(shards), sum(s.n_items for s in shards))
    counts, failures, unmarked = {"run": 0, "cached": 0, "failed": 0, "jobs": set()}, [], []
    stream = as_completed([f.wrapped_future for _, f, _ in pending.values()], loop=runner.client.loop)
    marking = None
    for done in stream:
        kind, future, covered = pending.pop(done.key)
        try:
            result = future.result()
        except Exception as exc:  # failed after retries, or the worker died (KilledWorker)
            failures.extend(_failure(future, shard, exc) for shard in covered)
        else:
            _account(kind, future, result, covered, counts, progress, unmarked)
        if kind == "marker":
            marking = None
        if unmarked and marking is None:  # one marker task in flight; the next takes what queued up
            marking = runner.submit(write_done_marker, {"stage": stage, "results": [r for r, _ in unmarked],
                                                        "label": marker_label([r for r, _ in unmarked])})
            pending[marking.wrapped_future.key] = ("marker", marking, [s for _, s in unmarked])
            stream.add(marking.wrapped_future)
            unmarked = []
    if failures:
        raise Espnet3PrefectError(f"test set {stage.test_set!r}: {len(failures)} shard(s) failed: " + "; ".join(failures[:5]))
    return counts


def _account(kind, future, result, covered, counts, progress, unmarked) -> None:
    """Book one finished future: a marker batch (shards done), a cached shard, or a shard to mark."""
    if kind == "marker":
        for record, shard in zip(result, covered):
            counts["failed"] += record.get("failed", 0)
            progress.advance(shard.n_items)
        return
    [shard] = covered
    state = future.state
    if result.get("reused") or (state is not None and state.is_completed() and state.name == "Cached"):
        counts["cached"] += 1
        counts["failed"] += result.get("failed", 0)
        progress.advance(shard.n_items)
    else:
        counts["run"] += 1
        counts["jobs"].update(filter(None, [result.get("slurm_job_id") or result.get("sge_job_id")]))  # batch job
        unmarked.append((result, shard))


def _failure(future, shard: Shard, exc: Exception) -> str:
    """One line naming the shard; a shard whose worker died is marked Crashed in the API."""
    where = f"split.{shard.index} items [{shard.start}, {shard.stop})"
    if getattr(future, "_final_state", None) is None:  # Dask lost it: Prefect never saw the end
        from prefect.runtime import flow_run

        message = f"{where}: its worker died while running it ({type(exc).__name__}); not retried further"
        mark_task_run_crashed(future.task_run_id, message, task=run_shard, name=f"run-shard-{shard.index}",
                              flow_run_id=flow_run.id)
        return message
    return f"{where}: {type(exc).__name__}: {one_line(exc)}"


def _forget_env(runner, stage: Stage) -> None:
    """Drop this test set's env on every worker (frees the model before the next test set)."""
    try:
        runner.client.unregister_worker_plugin(f"espnet3-env-{stage.env_key}")
    except Exception:  # best effort: a worker that left has nothing to free
        pass
