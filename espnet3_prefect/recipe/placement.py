"""Where a stage runs: the ``placement`` block of the config a stage reads, ``placement.<stage>`` in the
vocabulary of a ``parallel`` block (``env``, ``options``), ESPnet3's stage run as one job there.

A stage without a placement runs as ESPnet3 runs it, in the recipe's own process: parity is
unchanged. ``infer``, ``measure`` and ``collect_stats`` already run where their own ``parallel``
block says, so they take none. Example, in the training config (ESPnet3 reads no ``placement`` key)::

    placement:
      train:                      # one SLURM job holding one node with two GPUs, for 2 days at most
        env: slurm
        options: {cores: 16, memory: 120GB, walltime: "2-00:00:00",
                  job_extra_directives: ["--gres=gpu:2", "--nodes=1"]}

``env: local`` runs the stage in a child process of this machine (a cancel stops it and all it
started); a batch scheduler's env runs it as one job whose script is the one the backend writes for a
worker with the same options (``espnet3-prefect cluster-script --config conf/training.yaml --stage
train`` prints it). The job loads the stage as the driver holds it (the system, its configs, a resume
checkpoint: cloudpickled into the job's folder ``<stage log folder>/.stage-jobs/<stage>``) and writes
its result there; ``<stage>.log`` is ESPnet3's, written by the job. Editing a placement never reruns a
stage: where a stage runs is not what it writes.

>>> placement_spec({"env": "local"}, "placement.train").env
'local'
>>> placement_spec({"env": "local", "n_workers": 2}, "placement.train")
Traceback (most recent call last):
...
espnet3_prefect.errors.ConfigError: placement.train.n_workers: a placed stage is one job; remove it
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution import backends
from espnet3_prefect.execution.backends.jobs import JOB_PREFIX, current_flow_run_id, run_tag
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.execution.stage_job import (
    JOBS_DIRNAME,
    BatchJob,
    JobOutcome,
    JobPaths,
    ProcessJob,
    StageJob,
    wait_for,
    write_payload,
)
from espnet3_prefect.recipe import system as sysview
from espnet3_prefect.recipe.table import PREFECT_STAGES

KEY = "placement"
#: keys of a ``parallel`` block that mean nothing for one job
NOT_FOR_ONE_JOB = (
    "n_workers",
    "address",
    "num_shards",
    "shard_duration",
    "allow_overwrite_lock",
    "no_worker_timeout_s",
)

log = logging.getLogger("espnet3_prefect")


def placement_spec(block: Any, key: str) -> ParallelSpec:
    """A validated placement block (``key``: where it is, for errors)."""
    if isinstance(block, DictConfig):
        block = OmegaConf.to_container(block, resolve=True)
    if not isinstance(block, Mapping):
        raise ConfigError(f"{key}: must be a mapping like a parallel block (env, options), got {block!r}")
    for name in NOT_FOR_ONE_JOB:
        if name in block and not (name == "n_workers" and block[name] == 1):
            raise ConfigError(f"{key}.{name}: a placed stage is one job; remove it")
    spec = _parallel_spec({**block, "tls": False}, key)
    backend = backends.get(spec.env)
    if spec.env != "local" and not (backend.batch and hasattr(backend.load_cluster_class(), "job_cls")):
        valid = ["local", *(b.name for b in backends.batch() if b.name != "htcondor")]
        raise ConfigError(f"{key}.env: {spec.env!r} cannot run one stage job; valid: {', '.join(valid)}")
    if spec.env == "local" and spec.options:
        raise ConfigError(f"{key}.options.{next(iter(spec.options))}: env local runs a child process; it takes none")
    return spec


def _parallel_spec(block: Mapping[str, Any], key: str) -> ParallelSpec:
    """``ParallelSpec.from_config(block)``, its errors naming ``key`` where they name ``parallel``."""
    try:
        return ParallelSpec.from_config(block)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("parallel.", f"{key}.", 1)) from None


def placements(system: Any) -> dict[str, ParallelSpec]:
    """``{stage: spec}`` for every stage a config of ``system`` places, each in the config it reads."""
    found: dict[str, ParallelSpec] = {}
    names = sysview.stage_names(system)
    for attr, config in vars(system).items():
        if not attr.endswith("_config") or not isinstance(config, DictConfig) or KEY not in config:
            continue
        role = attr[: -len("_config")]
        block = config[KEY]
        if block is None:
            continue
        if not isinstance(block, DictConfig) or OmegaConf.is_list(block):
            raise ConfigError(f"{KEY}: in the {role} config, must map stage names to blocks like parallel's")
        for stage, value in block.items():
            key = f"{KEY}.{stage}"
            if stage not in names:
                raise ConfigError(f"{key}: {type(system).__name__} has no stage {stage!r}; its stages: {names}")
            if stage in PREFECT_STAGES:
                raise ConfigError(f"{key}: {stage} runs where its own config's parallel block says; remove it")
            reads = sysview.role_of(system, stage)
            if reads != role:
                raise ConfigError(f"{key}: {stage} reads the {reads} config; place it there, not in the {role} config")
            found[stage] = placement_spec(value, key)
    return found


#: the stages whose own config's ``parallel`` block says where they run (``collect_stats``: the training
#: config's, ``infer``: the inference config's); ``measure`` runs in the flow's process
PARALLEL_STAGES = ("infer", "collect_stats")


def place(run: Any, where: Mapping[str, Any] | None, key: str = "place") -> None:
    """Where stages run, given beside the configs (a deployment's ``place`` parameter):
    ``{stage: parallel-shaped block}``. For ``infer`` and ``collect_stats`` the block replaces their
    config's ``parallel`` block (N workers on the cluster it names); for ESPnet3's other stages it is their
    placement (one job). Nothing of it is an input of a stage: a done stage stays Cached."""
    names = sysview.stage_names(run.system)
    for stage, block in (where or {}).items():
        name = f"{key}.{stage}"
        if stage not in names:
            raise ConfigError(f"{name}: {type(run.system).__name__} has no stage {stage!r}; its stages: {names}")
        if stage == "measure":
            raise ConfigError(f"{name}: measure runs in the flow's process; remove it")
        if stage not in PARALLEL_STAGES:
            run.placed[stage] = placement_spec(block, name)
            continue
        block = OmegaConf.to_container(block, resolve=True) if isinstance(block, DictConfig) else dict(block or {})
        _parallel_spec(block, name)
        role = sysview.role_of(run.system, stage)
        for config in (sysview.config_of(run.system, role), run.pristine.get(f"{role}_config")):
            if config is not None:
                OmegaConf.update(config, "parallel", block, merge=False, force_add=True)


def job_paths(system: Any, stage: str) -> JobPaths:
    return JobPaths(sysview.log_dir_of(system, stage) / JOBS_DIRNAME / stage)


def job_name(system: Any, stage: str, spec: ParallelSpec, flow_run_id: Any = None) -> str:
    """``<prefix>-<stage>-<run tag>``: ``squeue`` says which stage of which recipe run a job serves, and
    cleanup by run tag finds it (prefix ``e3p`` unless ``options.job_name`` sets one)."""
    prefix = spec.options.get("job_name") or JOB_PREFIX
    return f"{prefix}-{stage}-{run_tag(flow_run_id or current_flow_run_id())}"


def stage_job(system: Any, stage: str, spec: ParallelSpec, root: Path) -> StageJob:
    """The job that runs ``stage`` where ``spec`` places it (not submitted)."""
    paths = job_paths(system, stage)
    if spec.env == "local":
        return ProcessJob(paths, cwd=root)
    return BatchJob(backends.get(spec.env), spec, paths, job_name(system, stage, spec), cwd=root)


def job_logging() -> None:
    """In the job: the console logging ESPnet3's launcher sets up (its format, level INFO)."""
    try:
        from espnet3.utils.logging_utils import configure_logging
    except ImportError:
        logging.basicConfig(level=logging.INFO)
    else:
        configure_logging()


def run_placed(run: Any, stage: str, spec: ParallelSpec, stop: Any = None) -> JobOutcome:
    """Run ``stage`` of the recipe run ``run`` as one job where ``spec`` places it, and wait: its output
    lines are logged here (the stage's task run in the UI), its failure or death raises
    :class:`~espnet3_prefect.execution.stage_job.JobFailed` naming the job; ``stop`` (an Event) set, or
    Ctrl-C, cancels the job and waits until it is gone
    (:class:`~espnet3_prefect.execution.stage_job.JobCancelled`)."""
    job = stage_job(run.system, stage, spec, run.root)
    write_payload(job.paths, functools.partial(run.run_stage, stage), job_logging)
    job_id = job.submit()
    log.info("%s: %s submitted; its output: %s", stage, job.describe(), job.paths.output)
    lines = logging.getLogger(f"espnet3_prefect.job.{stage}")
    lines.setLevel(logging.INFO)  # the job's lines reach the stage's run whatever the root logger's level
    outcome = wait_for(job, job.paths, on_line=lambda line: lines.info("%s", line), stop=stop)
    log.info("%s: %s done after %.1f s", stage, job.describe(), outcome.running_s)
    assert outcome.job_id == job_id
    return outcome


__all__ = [
    "KEY",
    "PARALLEL_STAGES",
    "job_logging",
    "place",
    "job_name",
    "job_paths",
    "placement_spec",
    "placements",
    "run_placed",
    "stage_job",
]
