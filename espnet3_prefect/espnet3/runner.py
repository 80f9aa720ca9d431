"""``BaseRunner``: ESPnet3 202611's runner contract, standalone (works without espnet3 installed).

A runner applies a static or class-level ``forward(idx, **env)`` over dataset indices (ints, or lists
of ints when ``batch_size`` is set) and persists what it returns through per-shard hooks:
``open_writers`` -> ``write_record`` per result -> ``close_writers``, wrapped by the classmethods
``init_state`` / ``reduce_state`` / ``finalize_state``; ``merge(shard_dirs)`` then combines the
finished ``split.N`` folders. Signatures, defaults, attributes and state keys are upstream's, so a
recipe can switch its imports between ``espnet3`` and ``espnet3_prefect`` and nothing changes.

Who drives the hooks is not this class: :mod:`espnet3_prefect.pipeline.shard` runs a shard for *any* class
with these hooks (ours, the real espnet3 ones, or a plain class), locally or on Dask workers.

>>> class Square(BaseRunner):
...     @staticmethod
...     def forward(idx, **env):
...         return {"idx": idx, "sq": idx * idx}
>>> r = Square(None, 2, "/tmp/out")
>>> (r.batch_size, str(r.output_dir), r.shard_subdir, r.resume)
(2, '/tmp/out', '', True)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from espnet3_prefect.disk.layout import shard_dir_path
from espnet3_prefect.espnet3.envcall import call_hook

_CALL_HANDLER: Callable[[Any, Iterable[int]], Any] | None = None


def set_call_handler(handler: Callable[[Any, Iterable[int]], Any]) -> None:
    """Say what ``runner(indices)`` does: :mod:`espnet3_prefect.entry` (which the package imports)
    registers its dispatch here, so this contract module never imports the orchestration above it."""
    global _CALL_HANDLER
    _CALL_HANDLER = handler


class BaseRunner(ABC):
    """Subclass and implement ``forward`` as a static or class method (never capturing ``self``).

    Args mirror ESPnet3 202611 and may be given by position: ``provider`` builds the env,
    ``batch_size`` (None: ``forward`` gets an int; N: a list of up to N ints), ``output_dir`` (the
    shards go to ``output_dir/[shard_subdir]/split.N``), ``shard_subdir``, ``resume``.
    """

    def __init__(
        self,
        provider: Any,
        batch_size: int | None = None,
        output_dir: str | Path | None = None,
        shard_subdir: str = "",
        resume: bool = True,
    ):
        self.provider = provider
        self.batch_size = batch_size
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.shard_subdir = shard_subdir or ""
        self.resume = resume

    @staticmethod
    @abstractmethod
    def forward(idx: int | Iterable[int], dataset: Any, model: Any, **env: Any) -> Any:
        """Compute one item (``idx`` an int) or one batch (``idx`` a list of ints)."""
        raise NotImplementedError

    # -- per-shard hooks (upstream defaults) ---------------------------------------------------
    @staticmethod
    def open_writers(shard_dir: Path | None, **env: Any) -> dict[str, Any]:
        """Open per-shard writers; the default opens none."""
        return {}

    @staticmethod
    def write_record(writers: dict[str, Any], result: Any, state: dict[str, Any], **env: Any) -> None:
        """Persist one ``forward`` result; the default keeps it in ``state["records"]``."""
        state.setdefault("records", []).append(result)

    @staticmethod
    def close_writers(writers: dict[str, Any], state: dict[str, Any], **env: Any) -> dict[str, Any] | None:
        """Close every writer that has a ``close`` method; a returned dict is merged into the state."""
        for writer in writers.values():
            close = getattr(writer, "close", None)
            if callable(close):
                close()
        return None

    def merge(self, shard_dirs: list[Path]) -> Any:
        """Combine finished shard folders (given in shard order) into the final result; default: None."""
        return None

    # -- shard state (upstream's classmethods; hooks tolerate older, shorter signatures) -------
    @classmethod
    def init_state(cls, shard_id: int = 0, output_dir: str = "", shard_subdir: str = "", **env: Any) -> dict[str, Any]:
        """Create ``split.<shard_id>`` and open its writers; returns the shard state."""
        shard_dir = shard_dir_path(output_dir, shard_subdir, shard_id)
        shard_dir.mkdir(parents=True, exist_ok=True)
        writers = call_hook(
            cls.open_writers, shard_dir, env=env, shard_id=shard_id, output_dir=output_dir, shard_subdir=shard_subdir
        )
        return {"shard_id": shard_id, "shard_dir": str(shard_dir), "_writers": writers, "records": []}

    @classmethod
    def reduce_state(cls, state: dict[str, Any], result: Any, **env: Any) -> dict[str, Any]:
        """Fold one ``forward`` result into the state through ``write_record``."""
        call_hook(cls.write_record, state["_writers"], result, state, env=env)
        return state

    @classmethod
    def finalize_state(cls, state: dict[str, Any], **env: Any) -> dict[str, Any]:
        """Close the writers, merge what ``close_writers`` returns into the state, drop ``_writers``."""
        meta = call_hook(cls.close_writers, state.get("_writers", {}), state, env=env) or {}
        if meta:
            state.update(meta)
        state.pop("_writers", None)
        return state

    def __call__(self, indices: Iterable[int]) -> Any:
        """Run every shard of ``indices`` and return ``merge(...)`` of the finished shard folders.

        In this process unless a parallel config is registered (:func:`espnet3_prefect.set_parallel`),
        else as a run of the Prefect flow ``run-runner`` on the Dask cluster that config describes
        (:func:`espnet3_prefect.run`); finished shards are skipped when ``resume`` is on, as upstream does.
        """
        if _CALL_HANDLER is None:  # only while espnet3_prefect itself is half-imported
            raise RuntimeError("espnet3_prefect.entry is not imported yet: import espnet3_prefect first")
        return _CALL_HANDLER(self, indices)
