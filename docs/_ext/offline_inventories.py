"""Intersphinx without a network: ``objects.inv`` files written from the installed packages.

The docs build runs where only package registries are reachable (CI, the developers' machines),
so Dask's, distributed's and dask-jobqueue's published inventories cannot be downloaded, and
Prefect's documentation is not built with Sphinx at all. Instead, :data:`PROJECTS` lists, per
project, the names our pages and docstrings refer to and the public page that documents each one.
At build time every name is imported from the installed package (a name that no longer exists
fails the build: the link would be dead), its kind (module, class, function, method, attribute) is
read from the object, and an inventory in Sphinx's format (version 2, zlib) is written for each
project into the build's own folder. ``intersphinx_mapping`` in ``conf.py`` points at those files,
with the projects' public URLs as targets, so ``{class}`distributed.LocalCluster``` links to
distributed's page for it exactly as a downloaded inventory would.

To link a new name: add it to its project below with the page that documents it (Sphinx projects:
the page the ``autoclass``/``autofunction`` of that name is on; the anchor is the name itself).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import zlib
from pathlib import Path

# project -> (distribution, base URL, {documented name: page}). For the Sphinx-built projects the
# anchor is the documented name (Sphinx's own anchor); Prefect's pages (not Sphinx) are per module,
# with the lower-cased object name as the heading anchor.
PROJECTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "dask": (
        "dask",
        "https://docs.dask.org/en/stable/",
        {
            "dask.config.set": "configuration.html",
            "dask.config.get": "configuration.html",
            "distributed.deploy.ssh.SSHCluster": "deploying-ssh.html",
        },
    ),
    "distributed": (
        "distributed",
        "https://distributed.dask.org/en/stable/",
        {
            "distributed.Client": "api.html",
            "distributed.LocalCluster": "api.html",
            "distributed.SpecCluster": "api.html",
            "distributed.Future": "api.html",
            "distributed.deploy.Adaptive": "api.html",
            "distributed.diagnostics.plugin.WorkerPlugin": "plugins.html",
            "distributed.diagnostics.plugin.NannyPlugin": "plugins.html",
        },
    ),
    "dask_jobqueue": (
        "dask-jobqueue",
        "https://jobqueue.dask.org/en/latest/",
        {
            f"dask_jobqueue.{name}": f"generated/dask_jobqueue.{name}.html"
            for name in (
                "SLURMCluster",
                "SGECluster",
                "PBSCluster",
                "LSFCluster",
                "HTCondorCluster",
                "MoabCluster",
                "OARCluster",
            )
        },
    ),
    "prefect": (
        "prefect",
        "https://docs.prefect.io/v3/api-ref/python/",
        {
            "prefect.flow": "prefect-flows#flow",
            "prefect.flows.Flow": "prefect-flows#flow",
            "prefect.task": "prefect-tasks#task",
            "prefect.tasks.Task": "prefect-tasks#task",
            "prefect.task_runners.ThreadPoolTaskRunner": "prefect-task_runners#threadpooltaskrunner",
        },
    ),
    "prefect_dask": (
        "prefect-dask",
        "https://docs.prefect.io/integrations/prefect-dask/",
        {
            "prefect_dask.DaskTaskRunner": "index#run-tasks-on-dask",
            "prefect_dask.task_runners.DaskTaskRunner": "index#run-tasks-on-dask",
        },
    ),
}

ROLES = {
    "module": "py:module",
    "class": "py:class",
    "function": "py:function",
    "method": "py:method",
    "attribute": "py:attribute",
}


def resolve(name: str) -> object:
    """The object a dotted name documents, imported from the installed package."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def kind(name: str, obj: object) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    owner = name.rsplit(".", 1)[0]
    try:
        if inspect.isclass(resolve(owner)):
            return "method" if callable(obj) else "attribute"
    except (ImportError, AttributeError):
        pass
    return "function" if callable(obj) else "attribute"


def entries(project: str) -> list[tuple[str, str, str]]:
    """(name, role, URI relative to the project's base URL) for every listed name."""
    _, _, names = PROJECTS[project]
    out = []
    for name, page in sorted(names.items()):
        try:
            obj = resolve(name)
        except (ImportError, AttributeError) as exc:
            raise RuntimeError(
                f"docs/_ext/offline_inventories.py: {name} ({project}) does not import "
                f"from the installed package: {exc}"
            ) from None
        uri = page if "#" in page else f"{page}#{name}"
        out.append((name, ROLES[kind(name, obj)], uri))
    return out


def write_inventory(project: str, folder: Path) -> Path:
    distribution, _, _ = PROJECTS[project]
    version = importlib.metadata.version(distribution)
    lines = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in entries(project))
    header = (
        f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    path = folder / f"{project}.inv"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.encode() + zlib.compress(lines.encode()))
    return path


def intersphinx_mapping(folder: Path) -> dict[str, tuple[str, str]]:
    """``intersphinx_mapping`` for conf.py: each project's public URL, its inventory written locally."""
    return {project: (base, str(write_inventory(project, folder))) for project, (_, base, _) in PROJECTS.items()}
