"""``env: kube``: ``dask_kubernetes.operator.KubeCluster``; the image must hold espnet3-prefect and the recipe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends.base import (
    Backend,
    ClusterContext,
    exported_environment,
    needs_preload,
    option_error,
)

REQUIRED = ("image",)


class KubeBackend(Backend):
    name = "kube"
    cluster_class = "dask_kubernetes.operator.KubeCluster"
    extra = "kube"

    def check_options(self, options: dict, lifetime_margin_s: float | None) -> None:
        """An image is required; ``env`` and ``resources`` are mappings. Other names are what the
        installed dask-kubernetes accepts, checked when it starts."""
        for key in REQUIRED:
            if not options.get(key):
                raise option_error(
                    key, "required for env 'kube' (a container image with espnet3-prefect and your recipe installed)"
                )
        for key in ("env", "resources"):
            value = options.get(key)
            if value is not None and not isinstance(value, Mapping):
                raise option_error(key, f"must be a mapping, got {type(value).__name__}")

    def cluster_kwargs(self, spec, context: ClusterContext) -> dict[str, Any]:
        """Named after the run, the Prefect API URL (and PYTHONPATH) in the pods' env."""
        options = dict(spec.options)
        exported = exported_environment(context.environ)
        if needs_preload(exported):
            raise ConfigError(
                "parallel.env 'kube': a Prefect API that asks for auth is not supported for pods yet "
                "(they cannot read the credential file on this machine's disk)"
            )
        env = {**exported, **{str(k): str(v) for k, v in (options.pop("env", None) or {}).items()}}
        return {"name": context.job_name, **options, "env": env, "n_workers": spec.n_workers}

    def preview(self, spec, kwargs: Mapping[str, Any]) -> tuple[str, str]:
        """The ``DaskCluster`` resource KubeCluster would create, or its arguments without dask-kubernetes."""
        from espnet3_prefect.execution.backends.preview import dump_yaml

        resource = render_kube_spec(kwargs)
        if resource is not None:
            return "yaml", dump_yaml(resource)
        return "yaml", (
            '# dask-kubernetes is not installed (pip install "espnet3-prefect[kube]"): '
            "the KubeCluster arguments\n" + dump_yaml(dict(kwargs))
        )


def render_kube_spec(kwargs: Mapping[str, Any]) -> dict | None:
    """The ``DaskCluster`` resource KubeCluster would create, or None without dask_kubernetes."""
    try:
        from dask_kubernetes.operator import make_cluster_spec
    except ImportError:
        return None
    passed = {
        k: kwargs[k]
        for k in ("image", "resources", "env", "worker_command", "scheduler_service_type", "idle_timeout", "jupyter")
        if kwargs.get(k) is not None
    }
    return make_cluster_spec(name=kwargs["name"], n_workers=kwargs.get("n_workers"), **passed)


BACKENDS = (KubeBackend(),)
