"""The stage rule: when is a stage done, so that a re-run skips it (Cached), and if not, why it runs.

A stage is **done** when its record (:mod:`~espnet3_prefect.recipe.record`) says it finished and
nothing it was computed from has changed since:

1. **its config**: the part of its role's resolved config that can change what it writes
   (:mod:`~espnet3_prefect.recipe.table`: ``train`` reads all of the training config but ``parallel``;
   ``collect_stats`` not the optimiser and trainer keys; ``infer`` not ``parallel`` nor the runner's
   retry and resume keys; ``measure`` its metrics config and the inference config's identity);
2. **the files its config names** (a checkpoint, a token list: by content; a file over 256 MiB by
   size and mtime), so a new checkpoint at the same path reruns ``infer``;
3. **its code**: the installed ``espnet`` version, and every recipe module it ran (the ``.py`` files
   under the recipe folder and ``$PYTHONPATH`` that were imported when it finished), by content;
4. **its upstream**: the output digests of every earlier stage of the system that has a record, as
   they were when it ran: a stage re-run that writes the same bytes changes nothing after it;
5. **its outputs** are still there, as they were written (size and mtime, else content).

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
        section = _only(section, io.reads)
    for key in io.ignores:
        section.pop(key, None)
    if io.also_reads_role:
        other = _plain(sysview.config_of(system, io.also_reads_role), io.also_reads_role)
        section = {role or "config": section, io.also_reads_role: other}
    return json.loads(json.dumps(section, sort_keys=True, default=str))


def _only(data: dict, keys: tuple[str, ...]) -> dict:
    """``data`` reduced to the (dotted) ``keys`` it has.

    >>> _only({"dataset": {"train": [1], "preprocessor": {"x": 1}}, "data_dir": "d", "model": {}},
    ...       ("dataset.train", "data_dir", "dataset_dir"))
    {'dataset': {'train': [1]}, 'data_dir': 'd'}
    """
    out: dict = {}
    for dotted in keys:
        *parents, leaf = dotted.split(".")
        source, target = data, out
        for part in parents:
            source = source.get(part) if isinstance(source, dict) else None
            target = target.setdefault(part, {})
        if isinstance(source, dict) and leaf in source:
            target[leaf] = source[leaf]
    return {key: value for key, value in out.items() if value != {}}


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


#: files named in a config up to this size are known by their content, larger ones by size and mtime
HASHED_FILE_BYTES = 256 << 20


def named_files(section: Any, root: Path) -> dict[str, str]:
    """``{path: identity}`` of every existing file a config section names (a checkpoint, a token
    list, a config file of ESPnet2's): its content's sha256, or for a file over
    :data:`HASHED_FILE_BYTES` its size and mtime. A new checkpoint at the same path is then a change.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "tokens.txt").write_text("a\\nb\\n")
    >>> list(named_files({"model": {"token_list": str(d / "tokens.txt"), "size": 2}}, d))
    ['tokens.txt']
    """
    found: dict[str, str] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and 0 < len(value) < 4096 and "\n" not in value:
            path = Path(value) if Path(value).is_absolute() else root / value
            try:
                if not path.is_file():
                    return
                st = path.stat()
                identity = sha256_of(path) if st.st_size <= HASHED_FILE_BYTES else f"{st.st_size}:{st.st_mtime_ns}"
            except OSError:
                return
            found[_shown(path, root)] = identity

    walk(section)
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
    old_files, new_files = recorded.get("files", {}), now.get("files", {})
    for name in sorted(old_files.keys() | new_files.keys()):
        if old_files.get(name) != new_files.get(name):
            what = "changed" if name in old_files and name in new_files else "new" if name in new_files else "gone"
            return f"input file {what}: {name}"
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
