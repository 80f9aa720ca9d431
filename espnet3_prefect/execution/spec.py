"""The ESPnet3 ``parallel`` block, validated, turned into a prefect-dask ``DaskTaskRunner``.

``env`` picks the backend (:mod:`espnet3_prefect.execution.backends`), ``n_workers`` how many workers (or
jobs) it starts, ``options`` go to its Dask cluster class. ``tls`` (default: on for batch schedulers
and ssh, off for local) puts the scheduler and workers on TLS with per-run certificates
(:mod:`espnet3_prefect.execution.backends.tls`). ``address`` connects to a running scheduler.
Everything is checked before any cluster starts; optional backends are imported lazily.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from espnet3_prefect._internal.util import is_int
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution import backends
from espnet3_prefect.execution.api_reach import DEFAULT_API_OUTAGE_S
from espnet3_prefect.execution.backends.base import Backend, ClusterContext

# lifetime_margin_s: batch-scheduler workers retire this long before their walltime (backends/walltime.py).
# allow_overwrite_lock: ESPnet3's switch to replace a shard lock left by an interrupted run.
# tls: scheduler <-> workers over TLS with per-run certificates (None: the env's default).
# shard_duration: shards sized by the dataset's lengths() (pipeline/plan.py), handed out longest first.
# no_worker_timeout_s: how long a run waits once every worker it had is gone (flows/dispatch.py).
# api_outage_s: how long a run waits for a Prefect server that is not its own (server/watch.py).
TOP_LEVEL_KEYS = (
    "env",
    "n_workers",
    "options",
    "address",
    "num_shards",
    "shard_duration",
    "lifetime_margin_s",
    "allow_overwrite_lock",
    "tls",
    "no_worker_timeout_s",
    "api_outage_s",
)


@dataclass(frozen=True)
class ParallelSpec:
    """A validated ``parallel`` block.

    >>> ParallelSpec.from_config({"env": "local", "n_workers": 2}).n_workers
    2
    """

    env: str = "local"
    n_workers: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    address: str | None = None
    num_shards: int | None = None
    #: total length (in the units of the dataset's ``lengths()``, e.g. seconds of audio) per shard
    shard_duration: float | None = None
    lifetime_margin_s: float | None = None
    allow_overwrite_lock: bool = False
    tls: bool | None = None
    #: seconds a run waits with no worker, once it has had one, before it stops (None: forever)
    no_worker_timeout_s: float | None = Backend.no_worker_timeout_s
    #: seconds a run waits for a Prefect server that is not its own, unreachable or busy (None: forever)
    api_outage_s: float | None = DEFAULT_API_OUTAGE_S

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None) -> ParallelSpec:
        """Validate a plain-dict ``parallel`` block; ``None`` means local with one worker."""
        block = dict(block or {})
        unknown = sorted(set(block) - set(TOP_LEVEL_KEYS))
        if unknown:
            raise ConfigError(f"parallel.{unknown[0]}: unknown key; valid keys: {', '.join(TOP_LEVEL_KEYS)}")
        address = block.get("address")
        if address is not None:
            if not isinstance(address, str) or "://" not in address:
                raise ConfigError(f"parallel.address: {address!r} is not a scheduler address like tcp://host:8786")
            for key in ("env", "options", "lifetime_margin_s"):
                if block.get(key) not in (None, {}, ""):
                    raise ConfigError(
                        f"parallel.{key}: conflicts with parallel.address (a running scheduler has its own workers)"
                    )
            if block.get("tls") is not None:
                raise ConfigError(
                    "parallel.tls: conflicts with parallel.address (we cannot make a running scheduler's "
                    "certificates; for a tls:// address put its files in Dask's config distributed.comm.tls.*)"
                )
            wait_s = _no_worker_timeout(block, Backend.no_worker_timeout_s)
            return cls(env="address", address=address, no_worker_timeout_s=wait_s, **_common(block))
        env = block.get("env", "local")
        backend = backends.get(env)  # an unknown env fails before anything else is read
        common = _common(block)
        from espnet3_prefect.execution.backends.tls import tls_enabled

        tls = tls_enabled(backend, block.get("tls"))
        options = block.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"parallel.options: must be a mapping, got {type(options).__name__}")
        margin = backends.lifetime_margin(env, block.get("lifetime_margin_s"))
        backends.validate(env, dict(options), margin, tls=tls)
        wait_s = _no_worker_timeout(block, backend.no_worker_timeout_s)
        return cls(
            env=env, options=dict(options), lifetime_margin_s=margin, tls=tls, no_worker_timeout_s=wait_s, **common
        )


def _no_worker_timeout(block: Mapping[str, Any], default_s: float) -> float | None:
    """``parallel.no_worker_timeout_s``: absent, the backend's default; null, wait forever; else > 0."""
    if "no_worker_timeout_s" not in block:
        return default_s
    return _finite_positive(
        "parallel.no_worker_timeout_s",
        block["no_worker_timeout_s"],
        "a number of seconds > 0 (how long a run waits once every worker is gone), or null to wait forever",
    )


def _common(block: Mapping[str, Any]) -> dict[str, Any]:
    """The keys every kind of block has: n_workers, num_shards or shard_duration, allow_overwrite_lock."""
    num_shards = block.get("num_shards")
    shard_duration = check_shard_duration(block.get("shard_duration"))
    if shard_duration is not None and num_shards is not None:
        raise ConfigError(
            "parallel.shard_duration: conflicts with parallel.num_shards (one sizes shards by length, the "
            "other by count); keep one"
        )
    return {
        "n_workers": _positive_int("parallel.n_workers", block.get("n_workers", 1)),
        "num_shards": None if num_shards is None else _positive_int("parallel.num_shards", num_shards),
        "shard_duration": shard_duration,
        "allow_overwrite_lock": _flag("parallel.allow_overwrite_lock", block.get("allow_overwrite_lock")),
        "api_outage_s": api_outage_s(block),
    }


def api_outage_s(block: Mapping[str, Any]) -> float | None:
    """``parallel.api_outage_s``: absent, :data:`~espnet3_prefect.execution.api_reach.DEFAULT_API_OUTAGE_S`;
    null, wait forever; else a finite number > 0.

    >>> api_outage_s({}), api_outage_s({"api_outage_s": None}), api_outage_s({"api_outage_s": 20})
    (900.0, None, 20.0)
    """
    if "api_outage_s" not in block:
        return DEFAULT_API_OUTAGE_S
    return _finite_positive(
        "parallel.api_outage_s",
        block["api_outage_s"],
        "a number of seconds > 0 (how long a run waits for a Prefect server that is not its own once it stops "
        "answering, e.g. 900 for a restart or an upgrade), or null to wait forever",
    )


def check_shard_duration(value: Any) -> float | None:
    """``parallel.shard_duration`` checked: None (off) or a finite number > 0.

    >>> check_shard_duration(None), check_shard_duration(600)
    (None, 600.0)
    """
    return _finite_positive(
        "parallel.shard_duration",
        value,
        "a finite number > 0 (the total length per shard, in the units of the dataset's lengths(), e.g. "
        "seconds of audio)",
    )


def _finite_positive(key: str, value: Any, meaning: str) -> float | None:
    """None stays None; a finite number > 0 becomes a float; anything else is ``key: must be ...``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{key}: must be {meaning}, got {value!r}")
    return float(value)


def _positive_int(key: str, value: Any) -> int:
    if not is_int(value) or value <= 0:
        raise ConfigError(f"{key}: must be a positive integer, got {value!r}")
    return value


def _flag(key: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value


def preflight(spec: ParallelSpec) -> None:
    """What can only be checked on this machine, before any server or cluster starts: the backend's
    package imports (a missing one names the pip extra) and the backend's own checks (``local_gpu``:
    no more workers than visible GPUs). Also when every shard is cached and no cluster will start."""
    if spec.address:
        return
    backend = backends.get(spec.env)
    backend.before_start(spec)  # e.g. no GPU visible: said first, the missing package would not help
    backend.load_cluster_class()


def build_task_runner(spec: ParallelSpec, context: ClusterContext | None = None):
    """A prefect-dask ``DaskTaskRunner`` (our cheaper-to-submit subclass) for a validated spec;
    ``context``: per-run job name, log folder, environment (see :class:`ClusterContext`).

    >>> runner = build_task_runner(ParallelSpec(env="local", n_workers=2))
    >>> runner.cluster_kwargs["n_workers"]
    2
    """
    from espnet3_prefect.execution.task_runner import ShardTaskRunner

    if spec.address:
        return ShardTaskRunner(address=spec.address)
    backend = backends.get(spec.env)
    backend.before_start(spec)
    cluster_class = backend.load_cluster_class()
    return ShardTaskRunner(
        cluster_class=cluster_class,
        cluster_kwargs=backend.cluster_kwargs(spec, context or ClusterContext()),
        adapt_kwargs=backend.adapt_kwargs(spec),
    )
