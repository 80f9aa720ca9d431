"""Sphinx configuration of the espnet3-prefect site (Markdown pages through MyST-Parser).

Build it as CI does (warnings are errors): ``bash scripts/docs.sh`` (installs the ``docs`` extra in
.venv, then ``sphinx-build -W --keep-going -b html docs docs/_build/html``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT))  # flows/ and tasks/ import under their installed names from the checkout too

import offline_inventories  # noqa: E402

import espnet3_prefect  # noqa: E402

project = "espnet3-prefect"
author = "espnet3-prefect developers"
copyright = "2026, espnet3-prefect developers"
release = version = espnet3_prefect.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_title = f"espnet3-prefect {release}"
html_theme_options = {
    "description": "ESPnet3 inference, metrics and your own workloads as Prefect flows on Dask",
    "page_width": "1180px",
    "sidebar_width": "230px",
}

# MyST: `#anchor` links to headings (## and ###) across pages, `{role}` syntax, fenced directives.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# API reference from the docstrings (they use Sphinx roles and doctest examples).
autodoc_default_options = {"members": True, "undoc-members": True, "ignore-module-all": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["espnet3", "espnet2", "dask_cuda", "dask_kubernetes", "asyncssh"]
autosummary_generate = False

# Intersphinx offline: inventories written at build time from the installed packages
# (docs/_ext/offline_inventories.py says why and how); nothing is downloaded.
intersphinx_mapping = offline_inventories.intersphinx_mapping(DOCS / "_build" / "inventories")
intersphinx_cache_limit = 0  # re-read them on every build (they are local files, written just now)

# Pages other branches add (checkpoints.md, runs.md): listed in the toctree when present, so the
# site builds with or without them.


def _modules() -> list[str]:
    """Every module of the package, in import order of the walk (new modules appear by themselves)."""
    import pkgutil

    names = ["espnet3_prefect"]
    for info in pkgutil.walk_packages(espnet3_prefect.__path__, "espnet3_prefect."):
        names.append(info.name)
    return sorted(set(names))


def _public_api() -> str:
    rows = ["| name | defined in |", "|---|---|"]
    for name in espnet3_prefect.__all__:
        obj = getattr(espnet3_prefect, name)
        module = getattr(obj, "__module__", "espnet3_prefect")
        role = "class" if isinstance(obj, type) else "func" if callable(obj) else "data"
        rows.append(f"| {{py:{role}}}`{name} <{module}.{name}>` | `{module}` |")
    return "\n".join(rows) + "\n"


# Modules that act when imported (the command's __main__; the worker preload, which reads the client
# file or exits): their docstring is read from the source instead of importing them.
RUN_ON_IMPORT = {"espnet3_prefect.cli.__main__", "espnet3_prefect.execution.worker_api"}


def _module_rst(name: str) -> str:
    if name == "espnet3_prefect":  # the package re-exports; each name is documented where it is defined
        return ".. automodule:: espnet3_prefect\n   :no-members:\n"
    if name in RUN_ON_IMPORT:
        import ast
        import importlib.util

        source = Path(importlib.util.find_spec(name).origin).read_text()
        return f".. py:module:: {name}\n\n{ast.get_docstring(ast.parse(source)) or ''}\n"
    return f".. automodule:: {name}\n"


def _api_page(app, docname, source):
    if docname != "api":
        return
    # autodoc writes reStructuredText: eval-rst parses it as such inside this Markdown page.
    blocks = [f"### `{name}`\n\n```{{eval-rst}}\n{_module_rst(name)}```\n" for name in _modules()]
    source[0] = source[0].replace("%% public api\n", _public_api()).replace("%% api modules\n", "\n".join(blocks))


def _our_short_names(app, env, node, contnode):
    """A docstring's ``:class:`ConfigError``` written in a module that does not define it: resolved to
    the one object of ours with that name (Sphinx looks only in the current module and at top level)."""
    if node.get("refdomain") != "py":
        return None
    from sphinx.util.nodes import make_refnode

    domain = env.get_domain("py")
    target = node["reftarget"].lstrip(".~")
    package, _, public = target.partition(".")
    if package == "espnet3_prefect" and public in espnet3_prefect.__all__:  # a re-export: where it is defined
        target = f"{getattr(espnet3_prefect, public).__module__}.{public}"
    found = [
        (name, entry)
        for name, entry in domain.find_obj(env, None, None, target, node["reftype"], 1)
        if name.startswith("espnet3_prefect.")
    ]
    if len(found) != 1:
        return None
    name, entry = found[0]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)


def setup(app):
    app.connect("missing-reference", _our_short_names)
    app.connect("source-read", _api_page)
