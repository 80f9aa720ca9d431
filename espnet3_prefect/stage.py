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
import os
import dataclasses
import hashlib
import inspect
import numbers
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .config import fingerprint, for_test_set, identity_config, list_test_sets
from .contract import load_inference_contract
from .errors import BadInputError, ConfigError, describe, one_line
from .inference_runner import key_list
from .layout import StageLayout
from .parallel import ParallelSpec
from .prefetch import DEFAULT_PREFETCH, check_prefetch
from .targets import instantiate, load_callable, locate
from .worker_env import EnvBuilder

# runner keys that steer the orchestration: ours, never passed to the runner's constructor
RUNNER_CONTROL_KEYS = ("retries", "retry_delay_s", "on_error", "max_failed_ratio", "min_free_mb", "prefetch")
ON_ERROR = ("fail", "skip")
DEFAULT_MAX_FAILED_RATIO = 0.05
DEFAULT_MIN_FREE_MB = 100.0
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY_S = (2.0, 10.0)


@dataclass(frozen=True)
class StageWork:
    """What a shard task needs: small, picklable, no runner instance and no model."""

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

    def with_dataset(self, dataset_id: str | None, lengths_id: str | None = None) -> "Stage":
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


@dataclass(frozen=True)
class Sizing:
    """What the plan needs to know of a test set's dataset: its length, its own fingerprint, and
    each item's cost when the dataset has ``lengths()`` (float64 array, checked) with their sha256."""

    n_items: int
    dataset_id: str | None = None
    lengths: Any = None
    lengths_id: str | None = None


def size_on_driver(stage: "Stage") -> Sizing | None:
    """``provider.build_dataset(config)`` on the driver, as ESPnet3's ``infer()`` does before it runs a
    test set: its length plans the shards, its fingerprint joins the stage's, and a typo in
    ``input_key`` fails here, before any cluster starts. None for a provider without
    ``build_dataset`` (the ``build-env`` task then sizes the test set on a worker)."""
    provider = getattr(stage.runner, "provider", None)
    build = getattr(provider, "build_dataset", None)
    if not callable(build):
        return None
    dataset = build(stage.config if stage.config is not None else provider.config)
    n_items = len(dataset)
    if n_items == 0:
        raise BadInputError(f"test set {stage.test_set!r}: dataset is empty; check the dataset manifest")
    params = getattr(provider, "params", None) or {}
    check_input_keys(dataset, params.get("input_key"), params.get("inference_contract"), stage.test_set)
    lengths = dataset_lengths(dataset, n_items, stage.test_set)
    return Sizing(n_items, dataset_id(dataset), lengths, None if lengths is None else lengths_fingerprint(lengths))


def dataset_lengths(dataset: Any, n_items: int, test_set: str) -> Any:
    """``dataset.lengths()`` checked (one finite number >= 0 per item, in dataset order) as a float64
    array, or None when the dataset has no ``lengths``. A bad one fails on one line.

    >>> class D:
    ...     def __len__(self): return 3
    ...     def lengths(self): return [1.5, 0, 7]
    >>> dataset_lengths(D(), 3, "t").tolist()
    [1.5, 0.0, 7.0]
    """
    import numpy as np

    method = getattr(dataset, "lengths", None)
    if not callable(method) or not _callable_without_arguments(method):
        return None  # not the protocol (an attribute, or a method that needs arguments): plan by counts
    where = f"test set {test_set!r}: {type(dataset).__name__}.lengths()"
    try:
        raw = method()
    except Exception as exc:  # noqa: BLE001 - named, on one line
        raise BadInputError(f"{where} failed: {describe(exc)}") from None
    if isinstance(raw, (str, bytes, Mapping)) or not hasattr(raw, "__len__"):
        raise BadInputError(f"{where}: must return a sequence with one number per item, got {type(raw).__name__}")
    values = np.asarray(raw) if not isinstance(raw, np.ndarray) else raw
    if values.ndim != 1 or len(values) != n_items:
        count = len(values) if values.ndim == 1 else f"an array of shape {values.shape}"
        raise BadInputError(f"{where}: returned {count} values for {n_items} items (one number per item, "
                            f"in dataset order)")
    if values.dtype.kind not in "iuf":
        bad = next((i for i, v in enumerate(raw) if isinstance(v, (bool, np.bool_))
                    or not isinstance(v, (numbers.Real, np.integer, np.floating))), 0)
        raise BadInputError(f"{where}[{bad}] is {raw[bad]!r} ({type(raw[bad]).__name__}): lengths must be numbers")
    values = values.astype(np.float64)
    bad_values = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad_values):
        bad = int(bad_values[0])
        raise BadInputError(f"{where}[{bad}] is {raw[bad]!r}: lengths must be finite numbers >= 0")
    return values


def _callable_without_arguments(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return True
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def lengths_fingerprint(lengths: Any) -> str:
    """sha256 of the checked lengths (float64, little-endian): the same lengths, the same plan."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(lengths, dtype="<f8").tobytes()).hexdigest()


def check_input_keys(dataset: Any, input_key: Any, contract: Any, test_set: str) -> None:
    """Item 0 must carry every (non-optional) input key: a typo in ``input_key`` fails once, here,
    not in every shard. Datasets whose items are not mappings are left to the runner."""
    keys = [input_key] if isinstance(input_key, str) else list(input_key or [])
    inputs = contract.get("inputs") if isinstance(contract, Mapping) else None
    optional = {name for name, spec in (inputs or {}).items() if isinstance(spec, Mapping) and spec.get("optional")}
    try:
        item = dataset[0]
    except Exception:  # noqa: BLE001 - reading an item is the runner's business; it names the item
        return
    if not isinstance(item, Mapping):
        return
    missing = [k for k in keys if k not in item and k not in optional]
    if missing:
        raise BadInputError(f"input_key: {missing[0]!r} is not a field of test set {test_set!r}'s items "
                            f"(item 0 has: {', '.join(sorted(map(str, item)))})")


def dataset_id(dataset: Any) -> str | None:
    """The dataset's own fingerprint when it offers ``fingerprint()`` (so changed data redoes shards)."""
    method = getattr(dataset, "fingerprint", None)
    return str(method()) if callable(method) else None


def code_identity(*objects: Any) -> str:
    """sha256 of the source of the given classes/functions (qualified name where source is absent)."""
    sha = hashlib.sha256()
    for obj in objects:
        if obj is not None:
            sha.update(_source(obj).encode())
    return sha.hexdigest()


def _source(obj: Any) -> str:
    """``inspect.getsource``; CPython 3.11's parser can raise ``SystemError: AST constructor recursion
    depth mismatch`` when another thread parses at the same moment (a class's source is found by
    parsing its module), so that error is retried, and we never give up on a transient one."""
    for attempt in range(5):
        try:
            with _SOURCE_LOCK:
                return inspect.getsource(obj)
        except (OSError, TypeError):
            return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', obj)}"
        except SystemError:
            time.sleep(0.05 * (attempt + 1))
    with _SOURCE_LOCK:
        return inspect.getsource(obj)


_SOURCE_LOCK = threading.Lock()


def prepare_stages(cfg: DictConfig) -> tuple[ParallelSpec, list[Stage]]:
    """Validate ``cfg`` and build one :class:`Stage` per test set (provider and runner instantiated)."""
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
    contract = _contract(cfg)
    control = _runner_control(runner_block)
    return spec, [_stage(cfg, name, Path(inference_dir), runner_cls, contract, control, spec) for name in names]


def _require_target(cfg: DictConfig, key: str) -> DictConfig:
    block = OmegaConf.select(cfg, key)
    if block is None:
        raise ConfigError(f"{key}: missing; add {key}: {{_target_: ...}} to the config")
    if not isinstance(block, DictConfig) or not block.get("_target_"):
        raise ConfigError(f"{key}._target_: missing; name the {key} class")
    locate(block._target_, f"{key}._target_")
    return block


def _contract(cfg: DictConfig) -> Any:
    """The ``contract:`` block, loaded now so a bad one fails before anything starts."""
    raw = cfg.get("contract")
    if raw is None:
        return None
    try:
        contract = load_inference_contract(raw)
    except ConfigError:
        raise
    except Exception as exc:  # upstream's loader raises TypeError/ValueError/ImportError
        raise ConfigError(f"contract: {type(exc).__name__}: {one_line(exc)}") from None
    if cfg.get("output_fn"):
        raise ConfigError("output_fn: cannot be combined with contract: (drop one of them)")
    contract.validate_input_keys(_input_key(cfg))
    return contract


def _input_key(cfg: DictConfig) -> Any:
    input_key = cfg.get("input_key")
    if input_key is None or input_key == "" or (not isinstance(input_key, str) and len(input_key) == 0):
        raise ConfigError("input_key: missing or empty; name the dataset field(s) the model reads")
    return input_key if isinstance(input_key, str) else list(input_key)


def _output_keys(cfg: DictConfig) -> list[str] | None:
    if cfg.get("output_keys") is None:
        return None
    keys = key_list(cfg.output_keys)
    if not keys:
        raise ConfigError("output_keys: empty list; omit it to write every output field")
    return keys


def stage_params(cfg: DictConfig, contract: Any = None) -> dict[str, Any]:
    """Provider params exactly as ESPnet3 202611's ``infer()`` builds them."""
    raw = OmegaConf.select(cfg, "provider.params")
    params = OmegaConf.to_container(raw, resolve=True) if raw is not None else {}
    if not isinstance(params, dict):
        raise ConfigError("provider.params: must be a mapping")
    added: dict[str, Any] = {"input_key": _input_key(cfg), "idx_key": cfg.get("idx_key", "utt_id"),
                             "output_keys": _output_keys(cfg)}
    if contract is not None:
        added["inference_contract"] = OmegaConf.to_container(cfg.contract, resolve=True)
        if getattr(contract, "imports", ()):
            added["inference_contract_root"] = str(Path(cfg.get("recipe_dir") or ".").resolve())
    if cfg.get("output_fn"):
        load_callable(cfg.output_fn, "output_fn")  # fail now, not on a worker
        added["output_fn_path"] = cfg.output_fn
    artifacts = cfg.get("output_artifacts") or {}
    added["output_artifacts"] = OmegaConf.to_container(artifacts, resolve=True) if OmegaConf.is_config(artifacts) \
        else dict(artifacts)
    clash = sorted(set(added) & set(params))
    if clash:
        raise ConfigError(f"provider.params.{clash[0]}: also set by the stage from the top-level config; keep one")
    return {**params, **added}


def _runner_control(block: DictConfig) -> dict:
    retries = block.get("retries", DEFAULT_RETRIES)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"runner.retries: must be an integer >= 0, got {retries!r}")
    delay = block.get("retry_delay_s", list(DEFAULT_RETRY_DELAY_S))
    delay = [delay] if isinstance(delay, (int, float)) else list(delay)
    if not delay or any(isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0 for d in delay):
        raise ConfigError(f"runner.retry_delay_s: must be a number or list of numbers >= 0, got {delay!r}")
    on_error = block.get("on_error", "fail")
    if on_error not in ON_ERROR:
        raise ConfigError(f"runner.on_error: {on_error!r} is not one of: {', '.join(ON_ERROR)}")
    ratio = block.get("max_failed_ratio", DEFAULT_MAX_FAILED_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ConfigError(f"runner.max_failed_ratio: must be a number from 0 to 1, got {ratio!r}")
    free = block.get("min_free_mb", DEFAULT_MIN_FREE_MB)
    if isinstance(free, bool) or not isinstance(free, (int, float)) or free < 0:
        raise ConfigError(f"runner.min_free_mb: must be a number >= 0, got {free!r}")
    return {"retries": retries, "retry_delay_s": tuple(float(d) for d in delay), "on_error": on_error,
            "max_failed_ratio": float(ratio), "min_free_mb": float(free),
            "prefetch": check_prefetch(block.get("prefetch", DEFAULT_PREFETCH))}


def check_batch_size(value: Any) -> int | None:
    """``batch_size`` is a positive int or null.

    >>> check_batch_size(None), check_batch_size(8)
    (None, 8)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"batch_size: must be a positive integer or null, got {value!r}")
    return value


def _stage(cfg: DictConfig, name: str, inference_dir: Path, runner_cls: type, contract: Any, control: dict,
           spec: ParallelSpec) -> Stage:
    config = copy.deepcopy(cfg)  # the provider's own copy (it updates it with its params), as infer() passes
    OmegaConf.set_struct(config, False)
    config.test_set = name
    out_dir = inference_dir.expanduser().resolve() / name  # our bookkeeping: absolute
    given_dir = Path(str(cfg.inference_dir)) / name  # what upstream gives the runner and the hooks
    params = stage_params(config, contract)
    batch_size = check_batch_size(cfg.get("batch_size"))
    provider_cfg = OmegaConf.create({k: v for k, v in cfg.provider.items() if k != "params"})
    provider = instantiate(provider_cfg, inference_config=config, params=params, _recursive_=False)
    runner = _runner(cfg, runner_cls, provider, params, batch_size, given_dir)
    resume = getattr(runner, "resume", True)
    if not isinstance(resume, bool):
        raise ConfigError(f"runner.resume: must be true or false, got {resume!r}")
    shard_subdir = str(getattr(runner, "shard_subdir", "") or "")
    if shard_subdir and (shard_subdir.startswith("/") or ".." in Path(shard_subdir).parts):
        raise ConfigError(f"runner.shard_subdir: {shard_subdir!r} must be a relative folder inside the output dir")
    output_fn = load_callable(params["output_fn_path"], "output_fn") if "output_fn_path" in params else None
    identity = {"config": identity_config(for_test_set(cfg, name)),
                "code": code_identity(runner_cls, type(provider), output_fn)}  # the dataset's id joins later
    setup = _worker_setup(provider)
    layout = StageLayout(out_dir, shard_subdir)
    work = StageWork(test_set=name, layout=layout, runner_cls=type(runner), env_key="", fingerprint=fingerprint(identity),
                     identity=identity, batch_size=batch_size, on_error=control["on_error"],
                     idx_key=params["idx_key"], allow_overwrite_lock=spec.allow_overwrite_lock, cwd=os.getcwd(),
                     prefetch=control["prefetch"])
    stage = Stage(work=work, runner=runner, builder=EnvBuilder(setup, str(given_dir), shard_subdir,
                                                               type(provider).__qualname__),
                  resume=resume, num_shards=spec.num_shards, n_workers=spec.n_workers, config=config,
                  **{k: v for k, v in control.items() if k not in ("on_error", "prefetch")})
    env_key = f"{name}-{stage.identity_fingerprint[:12]}"
    return dataclasses.replace(stage, work=dataclasses.replace(work, env_key=env_key))


def _runner(cfg: DictConfig, runner_cls: type, provider: Any, params: dict, batch_size: int | None,
            out_dir: Path) -> Any:
    block = OmegaConf.create({k: v for k, v in cfg.runner.items() if k not in RUNNER_CONTROL_KEYS})
    kwargs = {"provider": provider, "idx_key": params["idx_key"], "hyp_key": params["output_keys"] or [],
              "ref_key": [], "batch_size": batch_size, "output_dir": out_dir}
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


def _worker_setup(provider: Any) -> Any:
    """``provider.build_worker_setup_fn()``, called on the driver as upstream does; a provider with
    only ``build_env_local`` builds the env the local way on each worker."""
    build = getattr(provider, "build_worker_setup_fn", None)
    if callable(build):
        setup = build()
    elif callable(getattr(provider, "build_env_local", None)):
        setup = provider.build_env_local
    else:
        raise ConfigError(f"provider._target_: {type(provider).__qualname__} has neither build_worker_setup_fn() "
                          f"nor build_env_local()")
    if not callable(setup):
        raise ConfigError(f"provider._target_: {type(provider).__qualname__}.build_worker_setup_fn() must return a "
                          f"function, got {type(setup).__name__}")
    return setup
