"""Turn a loaded config into validated, picklable per-test-set stages (nothing runs yet).

Every check that can fail on bad config happens here, on the driver, before a cluster starts.
"""

from __future__ import annotations

import hashlib
import inspect
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .config import fingerprint, for_test_set, identity_config, list_test_sets
from .errors import ConfigError
from .parallel import ParallelSpec
from .provider import _accepts_kwarg
from .runner import BaseRunner, InferenceRunner, _load_output_fn, check_batch_size
from .targets import instantiate, locate

# runner keys that steer the orchestration and are not passed to the runner's constructor
RUNNER_CONTROL_KEYS = ("resume", "retries", "retry_delay_s", "on_error", "max_failed_ratio", "min_free_mb")
ON_ERROR = ("fail", "skip")
DEFAULT_MAX_FAILED_RATIO = 0.05
DEFAULT_MIN_FREE_MB = 100.0
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY_S = (2.0, 10.0)


@dataclass
class Stage:
    """One test set of the infer stage: everything a task needs, small enough to ship per task."""

    test_set: str
    out_dir: Path
    fingerprint: str
    identity: dict
    runner: BaseRunner
    resume: bool = True
    retries: int = DEFAULT_RETRIES
    retry_delay_s: tuple = DEFAULT_RETRY_DELAY_S
    on_error: str = "fail"
    max_failed_ratio: float = DEFAULT_MAX_FAILED_RATIO
    min_free_mb: float = DEFAULT_MIN_FREE_MB
    num_shards: int | None = None
    n_workers: int = 1

    @property
    def env_key(self) -> str:
        """Names this test set's env on the workers (config+code, before any dataset fingerprint)."""
        return f"{self.test_set}-{self.identity_fingerprint[:12]}"

    @property
    def identity_fingerprint(self) -> str:
        return fingerprint({"config": self.identity["config"], "code": self.identity["code"]})

    def with_dataset(self, dataset_id: str | None) -> "Stage":
        """This stage with the dataset's own fingerprint (when it offers one) in its identity."""
        if not dataset_id:
            return self
        identity = {**self.identity, "dataset": dataset_id}
        return dataclasses.replace(self, identity=identity, fingerprint=fingerprint(identity))

    @property
    def cache_dir(self) -> Path:
        """Where Prefect keeps shard results (hidden, beside the outputs, on the shared filesystem)."""
        return self.out_dir.parent / ".prefect-cache"

    def shard_dir(self, index: int) -> Path:
        return self.out_dir / f"split.{index}"


def dataset_id(dataset: Any) -> str | None:
    """The dataset's own fingerprint when it offers ``fingerprint()`` (so changed data redoes shards)."""
    method = getattr(dataset, "fingerprint", None)
    return str(method()) if callable(method) else None


def _require_target(cfg: DictConfig, key: str) -> DictConfig:
    block = OmegaConf.select(cfg, key)
    if block is None:
        raise ConfigError(f"{key}: missing; add {key}: {{_target_: ...}} to the config")
    if not isinstance(block, DictConfig) or not block.get("_target_"):
        raise ConfigError(f"{key}._target_: missing; name the {key} class")
    locate(block._target_, f"{key}._target_")
    return block


def code_identity(*objects: Any) -> str:
    """sha256 of the source of the given classes/functions (qualified name where source is absent)."""
    sha = hashlib.sha256()
    for obj in objects:
        if obj is None:
            continue
        try:
            sha.update(inspect.getsource(obj).encode())
        except (OSError, TypeError):
            sha.update(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', obj)}".encode())
    return sha.hexdigest()


def _stage_params(cfg: DictConfig, runner_cls: type) -> dict[str, Any]:
    """Provider params plus the keys ESPnet3's infer stage passes to forward through the env."""
    raw = cfg.provider.get("params")
    params = OmegaConf.to_container(raw, resolve=True) if raw is not None else {}
    if not isinstance(params, dict):
        raise ConfigError("provider.params: must be a mapping")
    added: dict[str, Any] = {"idx_key": cfg.get("idx_key") or "utt_id"}
    input_key = cfg.get("input_key")
    if issubclass(runner_cls, InferenceRunner) or input_key is not None:
        if input_key is None or input_key == "" or (not isinstance(input_key, str) and len(input_key) == 0):
            raise ConfigError("input_key: missing or empty; name the dataset field(s) the model reads")
        added["input_key"] = input_key if isinstance(input_key, str) else list(input_key)
    if cfg.get("output_keys") is not None:
        keys = cfg.output_keys
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys:
            raise ConfigError("output_keys: empty list; omit it to write every output field")
        added["output_keys"] = keys
    if cfg.get("output_fn"):
        _load_output_fn(cfg.output_fn)  # fail now, not on a worker
        added["output_fn"] = str(cfg.output_fn)
    for key in added:
        if key in params:
            raise ConfigError(f"provider.params.{key}: also set at the top level of the config; keep one")
    return {**params, **added}


def _runner_kwargs(cfg: DictConfig, runner_cls: type, out_dir: Path, params: dict) -> dict[str, Any]:
    kwargs = {k: v for k, v in OmegaConf.to_container(cfg.runner, resolve=True).items()
              if k != "_target_" and k not in RUNNER_CONTROL_KEYS}
    kwargs["batch_size"] = check_batch_size(cfg.get("batch_size"))
    kwargs["output_dir"] = str(out_dir)
    if _accepts_kwarg(runner_cls, "idx_key"):
        kwargs.setdefault("idx_key", params["idx_key"])
    return kwargs


def prepare_stages(cfg: DictConfig) -> tuple[ParallelSpec, list[Stage]]:
    """Validate ``cfg`` and build one :class:`Stage` per test set (provider/runner instantiated)."""
    inference_dir = cfg.get("inference_dir")
    if not inference_dir:
        raise ConfigError("inference_dir: missing; set where outputs go")
    parallel_block = cfg.get("parallel")
    spec = ParallelSpec.from_config(OmegaConf.to_container(parallel_block, resolve=True) if parallel_block else None)
    names = list_test_sets(cfg)
    _require_target(cfg, "provider")
    runner_block = _require_target(cfg, "runner")
    runner_cls = locate(runner_block._target_, "runner._target_")
    if not (isinstance(runner_cls, type) and issubclass(runner_cls, BaseRunner)) and not hasattr(runner_cls, "forward"):
        raise ConfigError(f"runner._target_: {runner_block._target_!r} has no static forward()")
    control = _runner_control(runner_block)
    stages = [_stage(cfg, name, Path(inference_dir), runner_cls, control, spec) for name in names]
    return spec, stages


def _runner_control(block: DictConfig) -> dict:
    retries = block.get("retries", DEFAULT_RETRIES)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"runner.retries: must be an integer >= 0, got {retries!r}")
    delay = block.get("retry_delay_s", list(DEFAULT_RETRY_DELAY_S))
    delay = [delay] if isinstance(delay, (int, float)) else list(delay)
    if not delay or any(isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0 for d in delay):
        raise ConfigError(f"runner.retry_delay_s: must be a number or list of numbers >= 0, got {delay!r}")
    resume = block.get("resume", True)
    if not isinstance(resume, bool):
        raise ConfigError(f"runner.resume: must be true or false, got {resume!r}")
    on_error = block.get("on_error", "fail")
    if on_error not in ON_ERROR:
        raise ConfigError(f"runner.on_error: {on_error!r} is not one of: {', '.join(ON_ERROR)}")
    ratio = block.get("max_failed_ratio", DEFAULT_MAX_FAILED_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ConfigError(f"runner.max_failed_ratio: must be a number from 0 to 1, got {ratio!r}")
    free = block.get("min_free_mb", DEFAULT_MIN_FREE_MB)
    if isinstance(free, bool) or not isinstance(free, (int, float)) or free < 0:
        raise ConfigError(f"runner.min_free_mb: must be a number >= 0, got {free!r}")
    return {"retries": retries, "retry_delay_s": tuple(float(d) for d in delay), "resume": resume,
            "on_error": on_error, "max_failed_ratio": float(ratio), "min_free_mb": float(free)}


def _stage(cfg: DictConfig, name: str, inference_dir: Path, runner_cls: type, control: dict,
           spec: ParallelSpec) -> Stage:
    sub = for_test_set(cfg, name)
    out_dir = inference_dir.expanduser().resolve() / name
    params = _stage_params(sub, runner_cls)
    provider_cfg = OmegaConf.create({k: v for k, v in sub.provider.items() if k != "params"})
    provider = instantiate(provider_cfg, inference_config=sub, params=params, _recursive_=False)
    runner_cfg = OmegaConf.create({k: v for k, v in sub.runner.items() if k not in RUNNER_CONTROL_KEYS})
    runner = instantiate(runner_cfg, provider=provider, _recursive_=False,
                         **_runner_kwargs(sub, runner_cls, out_dir, params))
    output_fn = _load_output_fn(params.get("output_fn"))
    code = code_identity(type(runner), type(provider), output_fn)
    identity = {"config": identity_config(sub), "code": code}  # the dataset's id joins after build-env
    fp = fingerprint(identity)
    return Stage(test_set=name, out_dir=out_dir, fingerprint=fp, identity=identity, runner=runner,
                 num_shards=spec.num_shards, n_workers=spec.n_workers, **control)
