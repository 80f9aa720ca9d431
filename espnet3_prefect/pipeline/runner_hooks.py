"""A runner class's shard hooks as ESPnet3 202611 calls them: the class's own ``init_state`` /
``reduce_state`` / ``finalize_state`` when it has them, else upstream's behaviour over its
``open_writers`` / ``write_record`` / ``close_writers`` (:class:`RunnerHooks`, used by
:mod:`espnet3_prefect.pipeline.shard`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.espnet3.envcall import call_hook


class RunnerHooks:
    """The class's own state hooks when it has them, else upstream's behaviour over its writer hooks."""

    def __init__(self, cls: type):
        self.cls = cls
        self.forward = cls.forward  # bound once (a classmethod makes a new object on every access)
        self._init = getattr(cls, "init_state", None)
        self._reduce = getattr(cls, "reduce_state", None)
        self._finalize = getattr(cls, "finalize_state", None)

    def init(self, shard_id: int, env: dict) -> dict:
        if self._init is not None:
            return call_hook(self._init, env=env, shard_id=shard_id)
        rest = {k: v for k, v in env.items() if k not in ("output_dir", "shard_subdir")}
        shard_dir = StageLayout(Path(env["output_dir"]), env.get("shard_subdir", "")).shard_dir(shard_id)
        shard_dir.mkdir(parents=True, exist_ok=True)
        writers = _optional_hook(
            self.cls,
            "open_writers",
            {},
            shard_dir,
            env=rest,
            shard_id=shard_id,
            output_dir=env["output_dir"],
            shard_subdir=env.get("shard_subdir", ""),
        )
        return {"shard_id": shard_id, "shard_dir": str(shard_dir), "_writers": writers, "records": []}

    def reduce(self, state: dict, result: Any, shard_id: int, env: dict) -> dict:
        if self._reduce is not None:
            return call_hook(self._reduce, state, result, env=env, shard_id=shard_id)
        write = getattr(self.cls, "write_record", None)
        if write is None:
            state.setdefault("records", []).append(result)
        else:
            call_hook(write, state["_writers"], result, state, env=env, shard_id=shard_id)
        return state

    def finalize(self, state: dict, shard_id: int, env: dict) -> dict:
        if self._finalize is not None:
            return call_hook(self._finalize, state, env=env, shard_id=shard_id)
        writers = state.get("_writers", {})
        meta = _optional_hook(self.cls, "close_writers", None, writers, state, env=env, shard_id=shard_id)
        if meta is None and getattr(self.cls, "close_writers", None) is None:
            close_quietly(writers)
        if meta:
            state.update(meta)
        state.pop("_writers", None)
        return state


def _optional_hook(cls: type, name: str, default: Any, *args: Any, env: dict, **explicit: Any) -> Any:
    fn = getattr(cls, name, None)
    return default if fn is None else call_hook(fn, *args, env=env, **explicit)


def close_quietly(writers: Any) -> None:
    """After a failure: close file handles the hooks opened, without calling ``close_writers``."""
    if isinstance(writers, dict):
        for writer in writers.values():
            close = getattr(writer, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - the original failure is what the user needs to see
                    pass
