"""Config -> validated per-test-set stages (nothing runs yet), built the way ESPnet3's ``infer()`` does.

The provider gets ``inference_config`` (the whole config with ``test_set`` set) and ``params`` named
and valued as upstream sets them (``input_key``, ``idx_key``, ``output_keys``, ``inference_contract``
(+ ``inference_contract_root``), ``output_fn_path``, ``output_artifacts``); the runner gets
``provider, idx_key, hyp_key=output_keys or [], ref_key=[], batch_size, output_dir`` plus its own
``runner:`` block (``resume``, ``shard_subdir``, ...). Every check that can fail on bad config happens
here, on the driver, before a server or cluster starts.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.keys import INFERENCE_KEYS, check_top_level_keys
from espnet3_prefect.config.load import fingerprint, for_test_set, identity_config, list_test_sets
from espnet3_prefect.config.runner_keys import (
    DEFAULT_MAX_FAILED_RATIO,
    DEFAULT_MIN_FREE_MB,
    DEFAULT_PREFETCH,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_DELAY_S,
    RUNNER_CONTROL_KEYS,
    check_batch_size,
    runner_control,
    runner_folder_options,
)
from espnet3_prefect.config.targets import instantiate, load_callable, locate
from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.pipeline.duration import check_max_duration, sorts_whole_test_set
from espnet3_prefect.pipeline.env import EnvBuilder
from espnet3_prefect.pipeline.plan import MAX_SHARD_TASKS_PER_FLOW
from espnet3_prefect.pipeline.provider_params import load_contract, stage_params
from espnet3_prefect.pipeline.sizing import code_identity


@dataclass(frozen=True)
class StageWork:
    """What a shard task needs: small, picklable, no runner instance and no model. Frozen and made
    of plain values, so it never holds a future: the flows' executor registers it as such with the task
    runner (:func:`espnet3_prefect.execution.task_runner.never_holds_futures`)."""

    test_set: str
    layout: StageLayout
    runner_cls: type
    env_key: str
    fingerprint: str
    identity: dict
    batch_size: int | None = None
    on_error: str = "fail"
    idx_key: str = "utt_id"
    allow_overwrite_lock: bool = False
    #: where the run started: a relative ``inference_dir`` (kept relative, as ESPnet3 writes it into
    #: artifact paths and the manifest) means the same folder only for workers started there
    cwd: str = ""
    #: ``runner.prefetch``: units read ahead of ``forward`` in a background thread (0: off)
    prefetch: int = DEFAULT_PREFETCH
    #: ``runner.max_duration``: batches cut by length, in the units of the dataset's ``lengths()`` (None:
    #: upstream's consecutive batches); part of the config, so of the fingerprint
    max_duration: float | None = None
    #: with ``max_duration``: the whole test set is sorted (shards are runs of its batches, the merged
    #: files put back in dataset order), else each shard's items (:func:`~.duration.sorts_whole_test_set`);
    #: part of the identity
    length_order: bool = False

    def marker_expectation(self, start: int, stop: int) -> dict:
        return {"fingerprint": self.fingerprint, "identity": self.identity, "start": start, "stop": stop}


@dataclass
class Stage:
    """One test set of the infer stage, on the driver."""

    work: StageWork
    runner: Any
    builder: EnvBuilder
    resume: bool = True
    retries: int = DEFAULT_RETRIES
    retry_delay_s: tuple = DEFAULT_RETRY_DELAY_S
    max_failed_ratio: float = DEFAULT_MAX_FAILED_RATIO
    min_free_mb: float = DEFAULT_MIN_FREE_MB
    num_shards: int | None = None
    n_workers: int = 1
    #: ``parallel.shard_duration``: shards sized by the dataset's ``lengths()``, handed out longest first
    shard_duration: float | None = None
    #: the most shards this stage plans with ``shard_duration`` (its share of the flow run's cap)
    max_shards: int = MAX_SHARD_TASKS_PER_FLOW
    #: the inference config for this test set as infer() hands it over (``test_set`` set, the
    #: provider's params not merged in): what upstream sizes the dataset with on the driver
    config: Any = None

    @property
    def test_set(self) -> str:
        return self.work.test_set

    @property
    def layout(self) -> StageLayout:
        return self.work.layout

    @property
    def out_dir(self) -> Path:
        return self.work.layout.output_dir

    @property
    def identity_fingerprint(self) -> str:
        """config + code, before the dataset's own fingerprint joins (names the env on workers)."""
        return fingerprint({"config": self.work.identity["config"], "code": self.work.identity["code"]})

    def with_dataset(self, dataset_id: str | None, lengths_id: str | None = None) -> Stage:
        """This stage with the dataset's own fingerprint (when it offers one) and the fingerprint of
        its ``lengths()`` (when it has them: they decide the plan) in its identity."""
        if not dataset_id and not lengths_id:
            return self
        identity = dict(self.work.identity)
        if dataset_id:
            identity["dataset"] = dataset_id
        if lengths_id:
            identity["lengths"] = lengths_id
        work = dataclasses.replace(self.work, identity=identity, fingerprint=fingerprint(identity))
        return dataclasses.replace(self, work=work)


def build_stages(cfg: DictConfig) -> tuple[ParallelSpec, list[Stage]]:
    """Validate ``cfg`` and build one :class:`Stage` per test set (provider and runner instantiated);
    a run builds them once, in its :class:`~espnet3_prefect.pipeline.run_plan.RunPlan`."""
    check_top_level_keys(cfg, INFERENCE_KEYS)  # a misspelt key first: it explains what fails after it
    inference_dir = cfg.get("inference_dir")
    if not inference_dir:
        raise ConfigError("inference_dir: missing; set where outputs go")
    parallel_block = cfg.get("parallel")
    spec = ParallelSpec.from_config(OmegaConf.to_container(parallel_block, resolve=True) if parallel_block else None)
    names = list_test_sets(cfg)
    _require_target(cfg, "provider")
    runner_block = _require_target(cfg, "runner")
    runner_cls = locate(runner_block._target_, "runner._target_")
    if not callable(getattr(runner_cls, "forward", None)):
        raise ConfigError(f"runner._target_: {runner_block._target_!r} has no static or class-level forward()")
    for key in ("dataset", "model"):
        if OmegaConf.select(cfg, f"{key}._target_") is not None:
            locate(OmegaConf.select(cfg, f"{key}._target_"), f"{key}._target_")
    contract = load_contract(cfg)
    control = runner_control(runner_block)
    stages = [_stage(cfg, name, Path(inference_dir), runner_cls, contract, control, spec) for name in names]
    share = max(1, MAX_SHARD_TASKS_PER_FLOW // len(stages)) if stages else MAX_SHARD_TASKS_PER_FLOW
    return spec, [dataclasses.replace(s, max_shards=share) for s in stages]


def _require_target(cfg: DictConfig, key: str) -> DictConfig:
    block = OmegaConf.select(cfg, key)
    if block is None:
        raise ConfigError(f"{key}: missing; add {key}: {{_target_: ...}} to the config")
    if not isinstance(block, DictConfig) or not block.get("_target_"):
        raise ConfigError(f"{key}._target_: missing; name the {key} class")
    locate(block._target_, f"{key}._target_")
    return block


def _stage(
    cfg: DictConfig, name: str, inference_dir: Path, runner_cls: type, contract: Any, control: dict, spec: ParallelSpec
) -> Stage:
    config = copy.deepcopy(cfg)  # the provider's own copy (it updates it with its params), as infer() passes
    OmegaConf.set_struct(config, False)
    config.test_set = name
    out_dir = inference_dir.expanduser().resolve() / name  # our bookkeeping: absolute
    given_dir = Path(str(cfg.inference_dir)) / name  # what upstream gives the runner and the hooks
    params = stage_params(config, contract)
    batch_size = check_batch_size(cfg.get("batch_size"))
    max_duration = check_max_duration(cfg.runner.get("max_duration"), batch_size)
    provider_cfg = OmegaConf.create({k: v for k, v in cfg.provider.items() if k != "params"})
    provider = instantiate(provider_cfg, inference_config=config, params=params, _recursive_=False)
    runner = _runner(cfg, runner_cls, provider, params, batch_size, given_dir)
    resume, shard_subdir = runner_folder_options(runner, "runner")
    output_fn = load_callable(params["output_fn_path"], "output_fn") if "output_fn_path" in params else None
    identity = {
        "config": identity_config(for_test_set(cfg, name)),
        "code": code_identity(runner_cls, type(provider), output_fn),
    }  # the dataset's id joins later
    length_order = max_duration is not None and sorts_whole_test_set(type(runner))
    if length_order:  # another plan than the one sorted in each shard, over the same config and code
        identity["order"] = "length, whole test set"
    setup = worker_setup(provider)
    layout = StageLayout(out_dir, shard_subdir)
    work = StageWork(
        test_set=name,
        layout=layout,
        runner_cls=type(runner),
        env_key="",
        fingerprint=fingerprint(identity),
        identity=identity,
        batch_size=batch_size,
        on_error=control["on_error"],
        idx_key=params["idx_key"],
        allow_overwrite_lock=spec.allow_overwrite_lock,
        cwd=os.getcwd(),
        prefetch=control["prefetch"],
        max_duration=max_duration,
        length_order=length_order,
    )
    stage = Stage(
        work=work,
        runner=runner,
        builder=EnvBuilder(setup, str(given_dir), shard_subdir, type(provider).__qualname__),
        resume=resume,
        num_shards=spec.num_shards,
        n_workers=spec.n_workers,
        shard_duration=spec.shard_duration,
        config=config,
        **{k: v for k, v in control.items() if k not in ("on_error", "prefetch")},
    )
    env_key = f"{name}-{stage.identity_fingerprint[:12]}"
    return dataclasses.replace(stage, work=dataclasses.replace(work, env_key=env_key))


def _runner(
    cfg: DictConfig, runner_cls: type, provider: Any, params: dict, batch_size: int | None, out_dir: Path
) -> Any:
    block = OmegaConf.create({k: v for k, v in cfg.runner.items() if k not in RUNNER_CONTROL_KEYS})
    kwargs = {
        "provider": provider,
        "idx_key": params["idx_key"],
        "hyp_key": params["output_keys"] or [],
        "ref_key": [],
        "batch_size": batch_size,
        "output_dir": out_dir,
    }
    accepted = _accepted(runner_cls)
    if accepted is not None:  # a class without **kwargs gets only what it takes (upstream would TypeError)
        kwargs = {k: v for k, v in kwargs.items() if k in accepted or k in ("provider",)}
    return instantiate(block, _recursive_=False, **kwargs)


def _accepted(cls: type) -> set[str] | None:
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def worker_setup(provider: Any) -> Any:
    """``provider.build_worker_setup_fn()``, called on the driver as upstream does; a provider with
    only ``build_env_local`` builds the env the local way on each worker."""
    build = getattr(provider, "build_worker_setup_fn", None)
    if callable(build):
        setup = build()
    elif callable(getattr(provider, "build_env_local", None)):
        setup = provider.build_env_local
    else:
        raise ConfigError(
            f"provider._target_: {type(provider).__qualname__} has neither build_worker_setup_fn() "
            f"nor build_env_local()"
        )
    if not callable(setup):
        raise ConfigError(
            f"provider._target_: {type(provider).__qualname__}.build_worker_setup_fn() must return a "
            f"function, got {type(setup).__name__}"
        )
    return setup
