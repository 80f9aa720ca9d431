"""What a cluster would start, built without starting anything (for ``cluster-script``): the job
script of a dask-jobqueue cluster, and YAML for people."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from espnet3_prefect.errors import ConfigError, one_line


def render_job_script(cluster_class: type, kwargs: Mapping[str, Any]) -> str:
    """The job script ``cluster_class(**kwargs)`` would submit, built without a scheduler or a job.

    The cluster object is created inside a running event loop with ``asynchronous=True`` and never
    awaited, so no scheduler starts and ``n_workers`` is left out so nothing is submitted. The
    scheduler address reads ``tcp://<insert-scheduler-address-here>:8786`` (``tls://`` with TLS).
    """
    from distributed.core import Status

    kwargs = {k: v for k, v in kwargs.items() if k != "n_workers"}

    async def build() -> str:
        cluster = cluster_class(asynchronous=True, **kwargs)
        try:
            script = cluster.job_script()
        finally:
            cluster.status = Status.closed  # never started: nothing to close
        if str(kwargs.get("protocol") or "").startswith("tls"):  # dask-jobqueue's placeholder says tcp://
            script = script.replace("tcp://<insert-scheduler-address-here>", "tls://<insert-scheduler-address-here>")
        return script

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        runner = asyncio.run
    else:  # called from async code: build in a thread with its own loop
        from concurrent.futures import ThreadPoolExecutor

        def runner(coro):
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(asyncio.run, coro).result()

    try:
        with no_new_folders(kwargs.get("log_directory")):  # dask-jobqueue creates the folder: undo that
            return runner(build())
    except ValueError as exc:  # dask-jobqueue's own checks, e.g. an unknown keyword
        raise ConfigError(f"parallel.options: {cluster_class.__name__} rejects them: {one_line(exc)}") from None


@contextlib.contextmanager
def no_new_folders(path: Any) -> Iterator[None]:
    """Remove, on the way out, the folders of ``path`` that did not exist on the way in (and are still
    empty): what a Job object's constructor creates for a script that is only shown."""
    created = _first_missing(path)
    try:
        yield
    finally:
        if created is not None:
            _remove_empty_tree(created)


def _first_missing(path: Any) -> str | None:
    """The outermost folder of ``path`` that does not exist yet (None when it all exists)."""
    if not path:
        return None
    current = os.path.abspath(os.path.expanduser(str(path)))
    missing = None
    while not os.path.exists(current):
        missing = current
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def _remove_empty_tree(top: str) -> None:
    for root, _dirs, _files in os.walk(top, topdown=False):  # deepest first
        try:
            os.rmdir(root)
        except OSError:
            return  # not empty: someone wrote there meanwhile; leave it


def dump_yaml(data: Any) -> str:
    """YAML for people: keys in order, repeated blocks written out (no ``&id001`` anchors).

    >>> print(dump_yaml({"b": 1, "a": [1, 2]}), end="")
    b: 1
    a:
    - 1
    - 2
    """
    import yaml

    class _Plain(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    return yaml.dump(data, Dumper=_Plain, sort_keys=False)
