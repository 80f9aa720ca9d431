"""The cluster class of ``env: local_gpu``: dask-cuda's ``LocalCUDACluster``, whose workers also get
the ``env`` the cluster is given.

dask-cuda sets each worker's nanny ``env`` to that worker's ``CUDA_VISIBLE_DEVICES`` alone, in
place of the cluster's ``env`` argument. A worker forked from the fork server (:mod:`.forkserver`)
needs the rest too: the driver's environment of now, a user's ``options.env`` and the list of names
it keeps. Here the given ``env`` goes under each worker's own (:func:`.local.with_worker_env`), so
both arrive, the GPU's pinning on top.

Imported only when ``local_gpu`` opens a cluster: importing it imports dask_cuda (the ``[gpu]`` extra).
"""

from __future__ import annotations

from typing import Any

from dask_cuda import LocalCUDACluster as DaskCudaCluster

from espnet3_prefect.execution.backends.local import with_worker_env


class LocalCUDACluster(DaskCudaCluster):
    def __init__(self, *args: Any, env: dict | None = None, **kwargs: Any):
        self.worker_env = dict(env or {})
        super().__init__(*args, **kwargs)

    def new_worker_spec(self) -> dict:
        return with_worker_env(super().new_worker_spec(), self.worker_env)
