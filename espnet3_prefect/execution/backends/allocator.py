"""Worker processes keep glibc's own memory allocator thresholds.

Dask's nanny exports ``MALLOC_TRIM_THRESHOLD_=65536`` to every worker process it starts
(``distributed.nanny.pre-spawn-environ``). Setting that variable at all turns off glibc's adaptive
mmap threshold, so every allocation of 128 KiB or more (a torch activation, a feature matrix)
becomes an mmap, fresh zeroed pages and an munmap: a conv model ran 1.7x slower and log-mel loading
1.4x slower in a Dask worker than in a plain process (docs/benchmarks.md, ``python -m
benchmarks.allocator``). We leave the variable out where it is Dask's shipped value: local clusters
get a Dask setting held while they live, batch jobs the same setting in their environment.
Another value in the Dask config is kept, and so is a ``MALLOC_TRIM_THRESHOLD_`` in the
environment: workers inherit it.
"""

from __future__ import annotations

#: the value Dask's nanny puts in ``MALLOC_TRIM_THRESHOLD_`` of every worker process it spawns
DASK_TRIM_DEFAULT = 65536
TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
#: the Dask variable a batch job exports for a nanny on the node (Dask reads it as a Python literal;
#: a None value makes the nanny leave the variable out)
JOB_VARIABLE = "DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"


def allocator_settings() -> dict:
    """The Dask setting for a nanny in this process: ``MALLOC_TRIM_THRESHOLD_`` left out when Dask's
    config has its shipped value, else nothing. (A nanny started earlier in this process leaves its
    value in this process's environment, where later workers inherit it: Dask sets its pre-spawn
    variables in the parent's environment.)

    >>> import dask
    >>> allocator_settings()
    {'distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_': None}
    >>> with dask.config.set({TRIM_KEY: 131072}):
    ...     allocator_settings()
    {}
    """
    import dask

    if dask.config.get(TRIM_KEY, None) != DASK_TRIM_DEFAULT:
        return {}
    return {TRIM_KEY: None}  # Dask's nanny drops a pre-spawn variable whose value is None


def allocator_exports() -> dict[str, str]:
    """The same for a batch job's nanny, as environment variables for its job script.

    >>> allocator_exports()
    {'DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON': '{"MALLOC_TRIM_THRESHOLD_": None}'}
    """
    return {JOB_VARIABLE: '{"MALLOC_TRIM_THRESHOLD_": None}'} if allocator_settings() else {}
