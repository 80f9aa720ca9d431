"""A provider/runner workload prepared for the flow ``run-runner``: checked indices, the shard plan, the env.

ESPnet3's developer-facing pattern (data preparation, feature extraction, statistics, any "one compute
kernel over indices") is: build a provider and a runner, register the ``parallel`` block once, call
``runner(range(len(dataset)))``. Here the same call runs

* in this process when no block is registered (:func:`espnet3_prefect.pipeline.in_process.run_in_process`, as upstream's
  local mode), or
* as a run of the flow ``run-runner`` (named after the runner class in the UI) whose shard tasks run on
  the ``DaskTaskRunner`` built from the block: the env built once per worker, retries, done markers,
  resume, the merge on the driver, progress and summary artifacts.

:func:`espnet3_prefect.run` (in :mod:`espnet3_prefect.entry`) does the second for any runner instance:
ours, a subclass of the real ``espnet3`` classes (whose own ``__call__`` would take upstream's Dask
path), or a plain class with the hooks; inside a running flow it is a subflow. Everything is checked
before a server or a cluster starts.

>>> import tempfile
>>> from espnet3_prefect import BaseRunner
>>> class Square(BaseRunner):
...     @staticmethod
...     def forward(idx, **env):
...         return idx * idx
>>> job = prepare_job(Square(None, 2, tempfile.mkdtemp()), [3, 1, 2], None)
>>> job.name, job.n_items, [s.indices for s in job.shards]
('Square', 3, [(3, 1), (2,)])
"""

from __future__ import annotations

import hashlib
import operator
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.load import fingerprint, identity_config
from espnet3_prefect.config.runner_keys import check_batch_size, runner_control, runner_folder_options
from espnet3_prefect.disk.layout import RunnerLayout
from espnet3_prefect.errors import BadInputError, ConfigError
from espnet3_prefect.execution.process_parallel import plain_parallel
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.pipeline.duration import check_max_duration
from espnet3_prefect.pipeline.env import EnvBuilder
from espnet3_prefect.pipeline.lengths import lengths_from_files
from espnet3_prefect.pipeline.plan import Shard, default_num_shards, plan_shards
from espnet3_prefect.pipeline.sizing import code_identity, dataset_lengths, lengths_fingerprint
from espnet3_prefect.pipeline.stage import Stage, StageWork, worker_setup


class RunnerJob:
    """One ``run-runner`` flow run, prepared on the driver: the runner, its stage and shard plan.

    As a flow parameter it reads as its summary (runner class, items, shards, output_dir, parallel):
    that is what the UI shows and what the API stores, never the runner, its provider or the indices.
    """

    __slots__ = ("runner", "stage", "shards", "spec", "n_items", "name", "summary")

    def __init__(self, runner: Any, stage: Stage, shards: list[Shard], spec: ParallelSpec, n_items: int, summary: dict):
        self.runner, self.stage, self.shards, self.spec = runner, stage, shards, spec
        self.n_items, self.name, self.summary = n_items, type(runner).__qualname__, summary

    def builder(self) -> EnvBuilder:
        """The workers' env: ``provider.build_worker_setup_fn()`` (called now, on the driver, as upstream
        does) plus ``output_dir`` / ``shard_subdir``; a runner without a provider gets an empty env."""
        provider = getattr(self.runner, "provider", None)
        setup = _empty_env if provider is None else worker_setup(provider)
        return EnvBuilder(
            setup,
            str(self.runner.output_dir),
            self.stage.layout.shard_subdir,
            type(provider).__qualname__ if provider is not None else "provider",
        )

    # a mapping of the summary, for Prefect's parameter encoder
    def keys(self):
        return self.summary.keys()

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def __repr__(self) -> str:
        return f"RunnerJob({self.summary})"


def _empty_env() -> dict:
    return {}


def prepare_job(runner: Any, indices: Iterable[int], parallel: Any, control: dict | None = None) -> RunnerJob:
    """Check everything and plan the shards (no server, no cluster, no env built).

    ``max_duration`` (in ``control``, else the runner's attribute of that name): batches cut by length
    within each shard, as the infer stage's ``runner.max_duration`` does for a runner with its own
    ``merge`` (:mod:`~.duration`): the items' lengths come from the provider's dataset built here
    (:func:`job_lengths`), the results reach the hooks in the list's order, grouped as without it."""
    cls = type(runner)
    name = cls.__qualname__
    if not callable(getattr(cls, "forward", None)):
        raise ConfigError(f"{name}: has no static or class-level forward()")
    if getattr(runner, "output_dir", None) is None:
        raise ConfigError(f"{name}.output_dir: not set; shards need a folder to go to")
    indices = check_indices(indices, name)
    batch_size = check_batch_size(getattr(runner, "batch_size", None))
    resume, shard_subdir = runner_folder_options(runner, name)
    spec = ParallelSpec.from_config(plain_parallel(parallel))
    if spec.shard_duration is not None:
        raise ConfigError(
            f"parallel.shard_duration: {name}(indices) has no lengths() to size shards by (only the infer "
            f"stage reads its dataset's lengths()); use parallel.num_shards or drop the key"
        )
    control = dict(control or {})
    max_duration = control.pop("max_duration", None)
    max_duration = check_max_duration(
        getattr(runner, "max_duration", None) if max_duration is None else max_duration, batch_size
    )
    control = runner_control(OmegaConf.create(_control_block(control)))
    layout = RunnerLayout(Path(runner.output_dir), shard_subdir)
    lengths = None if max_duration is None else job_lengths(runner, indices, name, layout)
    digest, identity = runner_fingerprint(runner, indices, batch_size, max_duration, lengths)
    count = spec.num_shards or default_num_shards(len(indices), spec.n_workers, batch_size)
    explicit = None if indices == list(range(len(indices))) else indices
    shards = plan_shards(
        name, len(indices), count, batch_size, indices=explicit, lengths=lengths, max_duration=max_duration
    )
    work = StageWork(
        test_set=name,
        layout=layout,
        runner_cls=cls,
        env_key=f"{name}-{digest[:12]}",
        fingerprint=digest,
        identity=identity,
        batch_size=batch_size,
        on_error=control["on_error"],
        idx_key=str(getattr(runner, "idx_key", None) or "utt_id"),
        allow_overwrite_lock=spec.allow_overwrite_lock,
        prefetch=control["prefetch"],
        max_duration=max_duration,
    )
    stage = Stage(
        work=work,
        runner=runner,
        builder=None,
        resume=resume,
        num_shards=spec.num_shards,
        n_workers=spec.n_workers,
        **{k: v for k, v in control.items() if k not in ("on_error", "prefetch")},
    )
    summary = {
        "runner": f"{cls.__module__}.{name}",
        "items": len(indices),
        "shards": len(shards),
        "batch_size": batch_size,
        **({"max_duration": max_duration} if max_duration is not None else {}),
        "output_dir": str(runner.output_dir),
        "shard_subdir": shard_subdir,
        "resume": resume,
        "parallel": plain_parallel(parallel),
    }
    return RunnerJob(runner, stage, shards, spec, len(indices), summary)


def _control_block(control: dict) -> dict:
    block = dict(control)
    delay = block.get("retry_delay_s")
    if isinstance(delay, tuple):
        block["retry_delay_s"] = list(delay)
    return {k: v for k, v in block.items() if v is not None}


def check_indices(indices: Iterable[int], name: str = "runner") -> list[int]:
    """``indices`` as a list of ints (any order); empty or non-int entries are a :class:`ConfigError`.

    >>> check_indices(range(3)), check_indices([4, 1])
    ([0, 1, 2], [4, 1])
    """
    try:
        out = list(indices)
    except TypeError:
        raise ConfigError(f"{name}: indices must be an iterable of ints, got {type(indices).__name__}") from None
    if not out:
        raise ConfigError(f"{name}: no indices to run")
    for position, value in enumerate(out):
        try:
            if isinstance(value, bool):
                raise TypeError
            out[position] = operator.index(value)  # ints, numpy ints
        except TypeError:
            raise ConfigError(
                f"{name}: indices[{position}] is {value!r} ({type(value).__name__}), not an int"
            ) from None
    return out


def runner_fingerprint(
    runner: Any, indices: list[int], batch_size: int | None, max_duration: float | None = None, lengths: Any = None
) -> tuple[str, dict]:
    """``(sha256, identity)`` of what decides a shard's output: the runner and provider classes' code,
    the provider's config (minus ``parallel`` and retry settings) and params, ``batch_size`` and
    the index list, and with ``max_duration`` the budget and the items' lengths. The same for the local
    path and the flow, so either resumes the other's shards."""
    provider = getattr(runner, "provider", None)
    sha = hashlib.sha256(",".join(map(str, indices)).encode())
    identity = {
        "code": code_identity(type(runner), type(provider) if provider is not None else None),
        "config": _provider_config(provider),
        "batch_size": batch_size,
        "indices": {"count": len(indices), "sha256": sha.hexdigest()},
    }
    if max_duration is not None:
        identity["max_duration"] = max_duration
        identity["lengths"] = lengths_fingerprint(lengths)
    return fingerprint(identity), identity


def job_lengths(runner: Any, indices: list[int], name: str, layout: RunnerLayout) -> Any:
    """The lengths of ``indices`` (one per position, float64) for ``max_duration``: the provider's
    dataset built on the driver (``provider.build_dataset(provider.config)``, as the infer stage sizes a
    test set), its ``lengths()``, else its audio files' headers (cached under the runner's folder).
    Whatever is missing fails on one line naming the key, before anything starts."""
    provider = getattr(runner, "provider", None)
    build = getattr(provider, "build_dataset", None)
    if not callable(build):
        raise ConfigError(
            f"max_duration: {name}(indices): its provider ({type(provider).__name__}) has no build_dataset() "
            f"to read the items' lengths from before the run; add one or drop the key"
        )
    seen: set[int] = set()
    for index in indices:
        if index in seen:
            raise BadInputError(
                f"max_duration: {name}(indices): index {index} is listed twice; batches by duration need each "
                f"index once (drop the key to run the list as given)"
            )
        seen.add(index)
    dataset = build(provider.config)
    n_items = len(dataset)
    values = dataset_lengths(dataset, n_items, name)
    if values is None:
        params = getattr(provider, "params", None) or {}
        found = lengths_from_files(
            dataset, n_items, name, cache_file=layout.lengths_cache, input_key=params.get("input_key")
        )
        if found is None:
            raise ConfigError(
                f"max_duration: {name}(indices): its provider's dataset ({type(dataset).__name__}) has no lengths() "
                f"and no audio_paths() to read them from; add one or drop the key"
            )
        values = found.values
    outside = next((i for i in indices if not 0 <= i < n_items), None)
    if outside is not None:
        raise BadInputError(
            f"max_duration: {name}(indices): index {outside} is outside its provider's dataset ({n_items} items)"
        )
    return values[indices]


def _provider_config(provider: Any) -> Any:
    """The provider's ``config`` (and ``params`` when separate) as plain JSON, or None."""
    if provider is None:
        return None
    out = {}
    for attr in ("config", "params"):
        value = getattr(provider, attr, None)
        if value is None:
            continue
        if isinstance(value, DictConfig) or isinstance(value, Mapping):
            try:
                value = identity_config(value if isinstance(value, DictConfig) else OmegaConf.create(dict(value)))
            except Exception:  # noqa: BLE001 - a mapping OmegaConf cannot hold: its text stands for it
                value = repr(sorted(dict(value).items(), key=lambda kv: str(kv[0])))
        else:
            value = repr(value)
        out[attr] = value
    return out or None


def importable_from_workers() -> None:
    """Recipe modules import on every worker, also in batch jobs: the cwd and the folder of the
    running script join ``sys.path`` / ``PYTHONPATH`` (classes defined in ``__main__``, a script's
    or a notebook's, travel by value anyway)."""
    folders = [os.getcwd()]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and getattr(sys.modules.get("__main__"), "__spec__", None) is None:
        folders.append(str(Path(main_file).resolve().parent))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for folder in folders:
        if folder not in sys.path:
            sys.path.insert(0, folder)
        if folder not in parts:
            parts.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
