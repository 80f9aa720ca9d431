"""Env injection: call a function with env entries passed by name, as ESPnet3 does."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from espnet3_prefect.errors import ConfigError


@lru_cache(maxsize=256)
def accepts(fn: Callable) -> tuple[frozenset[str], bool]:
    """The keyword names ``fn`` accepts, and whether it takes ``**kwargs``. Cached."""
    params = inspect.signature(fn).parameters.values()
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


@lru_cache(maxsize=256)
def _positional_count(fn: Callable) -> int | None:
    """How many positional arguments ``fn`` takes; None when it takes ``*args``. Cached: the shard loop
    calls a writer hook once per item, and ``inspect.signature`` cost ~0.1 ms each time."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def call_with_env(fn: Callable, *args: Any, env: Mapping[str, Any], **explicit: Any) -> Any:
    """Call ``fn(*args, **explicit, **<env entries it accepts>)``.

    A function with ``**kwargs`` receives every env entry; otherwise only the entries named
    by its parameters. A name given both explicitly and by the env is an error naming it.

    >>> def forward(idx, model, **env): return model(idx)
    >>> call_with_env(forward, 3, env={"model": lambda i: i * 2, "unused": 1})
    6
    """
    names, takes_all = accepts(fn)
    clash = sorted(k for k in explicit if k in env and (takes_all or k in names))
    if clash:
        raise ConfigError(
            f"{getattr(fn, '__qualname__', fn)}: argument {clash[0]!r} is passed both explicitly and by "
            f"the provider env; rename one of them"
        )
    injected = {k: v for k, v in env.items() if takes_all or k in names}
    return fn(*args, **explicit, **injected)


def call_hook(fn: Callable, *args: Any, env: Mapping[str, Any], **explicit: Any) -> Any:
    """:func:`call_with_env` for writer hooks, which older ESPnet3 code declares with fewer
    positional parameters (``close_writers(writers)``): extra positional arguments are dropped.

    >>> def close_writers(writers): return sorted(writers)
    >>> call_hook(close_writers, {"a": 1}, {"state": 1}, env={"model": None}, shard_id=0)
    ['a']
    """
    positional = _positional_count(fn)
    if positional is not None:
        args = args[:positional]
        names, takes_all = accepts(fn)
        explicit = {k: v for k, v in explicit.items() if takes_all or k in names}
    return call_with_env(fn, *args, env=env, **explicit)
