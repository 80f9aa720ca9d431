"""The stage rule: when is a stage done, so that a re-run skips it (Cached), and if not, why it runs.

A stage is **done** when its record (:mod:`~espnet3_prefect.recipe.record`) says it finished and
nothing it was computed from has changed since:

1. **its config**: the part of its role's resolved config that can change what it writes
   (:mod:`~espnet3_prefect.recipe.table`: ``train`` reads all of the training config but ``parallel``;
   ``collect_stats`` not the optimiser and trainer keys; ``infer`` not ``parallel`` nor the runner's
   retry and resume keys; ``measure`` its metrics config and the inference config's identity);
2. **its code**: the installed ``espnet`` version, and every recipe module it ran (the ``.py`` files
   under the recipe folder and ``$PYTHONPATH`` that were imported when it finished), by content;
3. **its upstream**: the output digests of every earlier stage of the system that has a record, as
   they were when it ran: a stage re-run that writes the same bytes changes nothing after it;
4. **its outputs** are still there, as they were written (size and mtime, else content).

``--rerun STAGE`` reruns that stage and every later one of the run; ``--rerun all`` every stage.

>>> old = {"config": {"optimizer": {"lr": 0.005}}, "espnet": "202611", "upstream": {}}
>>> new = {"config": {"optimizer": {"lr": 0.01}}, "espnet": "202611", "upstream": {}}
>>> input_change(old, new)
'config changed: optimizer.lr (0.005 -> 0.01)'
>>> input_change(old, dict(old, espnet="202612"))
'espnet 202611 -> 202612'
>>> input_change(dict(old, upstream={"train": "a"}), dict(old, upstream={"train": "b"}))
"train's outputs changed"
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.load import identity_config
from espnet3_prefect.recipe import system as sysview
from espnet3_prefect.recipe.outputs import changed_outputs, sha256_of
from espnet3_prefect.recipe.record import StageRecord
from espnet3_prefect.recipe.table import io_of


def espnet_version() -> str:
    try:
        return importlib.metadata.version("espnet")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def config_section(system: Any, stage: str) -> dict:
    """The part of the stage's config that can change what it writes, resolved, as plain JSON data."""
    role = sysview.role_of(system, stage)
    io = io_of(stage, sysview.spec_of(system, stage).log_dir)
    section = _plain(sysview.config_of(system, role), role)
    if io.reads is not None:
        section = {key: section[key] for key in io.reads if key in section}
    for key in io.ignores:
        section.pop(key, None)
    if io.also_reads_role:
        other = _plain(sysview.config_of(system, io.also_reads_role), io.also_reads_role)
        section = {role or "config": section, io.also_reads_role: other}
    return json.loads(json.dumps(section, sort_keys=True, default=str))


def _plain(config: Any, role: str | None) -> dict:
    if config is None:
        return {}
    if role == "inference" and isinstance(config, DictConfig):
        return identity_config(config)  # the infer flow's own identity: no parallel, retries, resume
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    return dict(config)


#: packages whose code is an input by their version, not file by file (also from a source checkout on
#: ``$PYTHONPATH``): ESPnet's, and ours (it decides how a stage runs, not what it writes)
VERSIONED = ("espnet", "espnet2", "espnet3", "espnet3_prefect")


def recipe_modules(root: Path) -> dict[str, str]:
    """``{path: sha256}`` of every imported module of the recipe: a ``.py`` file under ``root`` (the
    recipe folder) or a ``$PYTHONPATH`` folder (``path.sh`` puts the TEMPLATE's there), outside the
    interpreter's own folders and :data:`VERSIONED` packages."""
    roots = [root.resolve(), *(Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    found = {}
    for module_name, module in list(sys.modules.items()):
        if module_name.partition(".")[0] in VERSIONED:
            continue
        name = getattr(module, "__file__", None)
        if not name or not name.endswith(".py"):
            continue
        path = Path(name).resolve()
        if any(base in path.parents for base in installed) or not any(base in path.parents for base in roots):
            continue
        try:
            found[_shown(path, root)] = sha256_of(path)
        except OSError:
            continue
    return dict(sorted(found.items()))


def _shown(path: Path, root: Path) -> str:
    rel = os.path.relpath(path, root.resolve())
    return str(path) if rel.startswith("..") else rel


def input_change(recorded: dict, now: dict) -> str | None:
    """One line naming what differs between the recorded inputs and today's (config, espnet, upstream)."""
    before, after = _flat(recorded.get("config", {})), _flat(now.get("config", {}))
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k, _ABSENT) != after.get(k, _ABSENT))
    if keys:
        first = keys[0]
        more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
        shown = f" ({_show(before.get(first, _ABSENT))} -> {_show(after.get(first, _ABSENT))})"
        return f"config changed: {first}{shown}{more}"
    if recorded.get("espnet") != now.get("espnet"):
        return f"espnet {recorded.get('espnet')} -> {now.get('espnet')}"
    old, new = recorded.get("upstream", {}), now.get("upstream", {})
    for stage in sorted(old.keys() | new.keys()):
        if stage not in old:
            return f"{stage} has run since"
        if old[stage] != new.get(stage):
            return f"{stage}'s outputs changed" if stage in new else f"{stage}'s record is gone"
    return None


def module_change(recorded: dict[str, str], root: Path) -> str | None:
    """One line naming the first recipe module whose content differs from the record (or is gone)."""
    for name, digest in recorded.items():
        path = Path(name) if Path(name).is_absolute() else root / name
        try:
            same = sha256_of(path) == digest
        except OSError:
            return f"recipe code gone: {name}"
        if not same:
            return f"recipe code changed: {name}"
    return None


def redo_reason(record: StageRecord | None, inputs: dict, root: Path) -> str | None:
    """None when the stage is done (its inputs unchanged and outputs intact), else why it runs."""
    if record is None:
        return "no finished run recorded"
    if not record.done:
        return f"the run started {record.when()} did not finish"
    return (
        input_change(record.inputs, inputs)
        or module_change(record.inputs.get("modules", {}), root)
        or changed_outputs(record.outputs, root)
    )


_ABSENT = object()


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): data}


def _show(value: Any) -> str:
    return "absent" if value is _ABSENT else json.dumps(value)[:40]


__all__ = ["config_section", "espnet_version", "input_change", "module_change", "recipe_modules", "redo_reason"]
