"""Config: merge ESPnet3 YAML files left to right, apply dotted overrides, validate, fingerprint.

The data path starts here: config -> plan shards -> build env per worker -> run shard ->
mark done -> merge -> report.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from espnet3_prefect.errors import ConfigError, one_line

# Keys that change how a stage runs, not what it writes: left out of the fingerprint, so
# resuming with more workers, another backend or other retry settings reuses finished shards.
_NOT_FINGERPRINTED = (
    "parallel",
    "runner.resume",
    "runner.retries",
    "runner.retry_delay_s",
    "runner.max_failed_ratio",
    "runner.min_free_mb",
    "runner.prefetch",
    "allow_keys",
)


def load_config(paths: Sequence[str | Path], overrides: Iterable[str] = ()) -> DictConfig:
    """Merge YAML files left to right, apply ``key=value`` overrides, resolve interpolations.

    Overrides follow Hydra's basic grammar: ``a.b=1`` sets, ``+a.b=1`` adds, ``~a.b`` deletes.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "c.yaml")
    >>> _ = open(p, "w").write("parallel: {env: local, n_workers: 1}\\n")
    >>> load_config([p], ["parallel.n_workers=4"]).parallel.n_workers
    4
    """
    if not paths:
        raise ConfigError("no config file given: pass --config conf/inference.yaml")
    cfg = OmegaConf.create({})
    for path in paths:
        cfg = OmegaConf.merge(cfg, read_yaml(Path(path)))
    for item in overrides:
        apply_override(cfg, item)
    return resolved(cfg)


def load_config_input(config: Any, overrides: Iterable[str] = ()) -> DictConfig:
    """A flow's ``config`` parameter: config file paths (merged left to right) or one config given as a
    mapping (``espnet3_prefect.infer(cfg)``, a deployment's dict parameter); then ``overrides``."""
    if isinstance(config, (dict, DictConfig)):
        cfg = OmegaConf.create(
            OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else config
        )
        for item in overrides or ():
            apply_override(cfg, item)
        return resolved(cfg)
    paths = [config] if isinstance(config, (str, Path)) else list(config or [])
    return load_config(paths, overrides or ())


def resolved(cfg: DictConfig) -> DictConfig:
    """``cfg`` with its interpolations resolved in place; a failure is a one-line ConfigError."""
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot resolve an interpolation: {one_line(exc)}") from None
    return cfg


# ESPnet3's config resolvers. Paths they take are relative to the YAML file that writes them, and
# ``${self_name:}`` is the stem of that file: both are rewritten per file before merging.
_FILE_RESOLVER = re.compile(r"\$\{(load_line|config_path):\s*(['\"]?)([^,}'\"]+)\2\s*\}")


def _load_line(path: str) -> ListConfig:
    return ListConfig([line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()])


def _register_resolvers() -> None:
    """Make ``load_line``, ``self_name`` and ``config_path`` resolvable, once per process.

    With espnet3 installed its own are used: ``espnet3.utils.config_utils`` registers them when it is
    imported, without replacing, so it must register first (a recipe's dataset builder imports it
    inside a worker too); ours only fill in what is not registered yet. Either order then works:

    >>> _register_resolvers(); _register_resolvers()
    >>> all(OmegaConf.has_resolver(n) for n in ("load_line", "self_name", "config_path"))
    True
    """
    if importlib.util.find_spec("espnet3") is not None:
        try:
            importlib.import_module("espnet3.utils.config_utils")
        except ImportError:
            pass
    for name, fn in (
        ("self_name", lambda value: value),
        ("config_path", lambda value: value),
        ("load_line", _load_line),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _per_file(value: Any, path: Path) -> Any:
    """Rewrite one YAML file's ``${self_name:}`` and relative resolver paths (recursively)."""
    if isinstance(value, dict):
        return {k: _per_file(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_per_file(v, path) for v in value]
    if not isinstance(value, str):
        return value
    if "${set_corpus_and_system:" in value:
        raise ConfigError(
            f"{path}: ${{set_corpus_and_system:}} is only resolved by ESPnet3's own egs3 loader; write the value out"
        )
    value = value.replace("${self_name:}", path.stem)

    def absolute(match: re.Match) -> str:
        resolver, quote, target = match.group(1), match.group(2), match.group(3).strip()
        if "${" in target or Path(target).is_absolute():
            return match.group(0)
        return f"${{{resolver}:{quote}{(path.parent / target).resolve().as_posix()}{quote}}}"

    return _FILE_RESOLVER.sub(absolute, value)


def read_yaml(path: Path) -> DictConfig:
    """One config file read and checked (a mapping, no ``defaults:`` list), its file resolvers applied."""
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise ConfigError(f"config file not found: {path}{where}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {one_line(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    if "defaults" in data:
        raise ConfigError(
            f"{path}: defaults: lists are not supported; pass the files to merge as --config base.yaml override.yaml"
        )
    _register_resolvers()
    return OmegaConf.create(_per_file(data, path.resolve()))


def apply_override(cfg: DictConfig, item: str) -> None:
    """Apply one ``key=value`` override to ``cfg`` in place (``+key=value`` adds, ``~key`` deletes)."""
    if item.startswith("~"):
        key = item[1:].split("=", 1)[0]
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            raise ConfigError(f"override {item!r}: key {key!r} is not in the config")
        del node[leaf]
        return
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, value = item.split("=", 1)
    adding = key.startswith("+")
    key = key.lstrip("+")
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    if not adding and OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
        raise ConfigError(f"override {item!r}: key {key!r} is not in the config (use +{key}=... to add it)")
    try:
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    OmegaConf.update(cfg, key, parsed, merge=False, force_add=True)


def list_test_sets(cfg: DictConfig) -> list[str]:
    """Names of ``dataset.test`` entries, validated: each has a unique, path-safe ``name``."""
    tests = OmegaConf.select(cfg, "dataset.test")
    if tests is None:
        raise ConfigError("dataset.test: missing; list the test sets as [{name: ...}, ...]")
    if not isinstance(tests, ListConfig) or len(tests) == 0:
        raise ConfigError("dataset.test: must be a non-empty list of {name: ...} entries")
    names: list[str] = []
    for i, entry in enumerate(tests):
        name = entry.get("name") if isinstance(entry, DictConfig) else None
        if not name or not isinstance(name, str):
            raise ConfigError(f"dataset.test[{i}]: test set has no 'name'")
        if "/" in name or name.startswith(".") or name != name.strip() or " " in name:
            raise ConfigError(f"dataset.test[{i}].name: {name!r} must be a plain folder name")
        if name in names:
            raise ConfigError(f"dataset.test[{i}].name: duplicate test set name {name!r}")
        names.append(name)
    return names


def for_test_set(cfg: DictConfig, name: str) -> DictConfig:
    """A copy of ``cfg`` for one test set: ``test_set`` set, ``dataset.test`` reduced to it."""
    sub = copy.deepcopy(cfg)
    OmegaConf.set_struct(sub, False)
    sub.test_set = name
    sub.dataset.test = [t for t in cfg.dataset.test if t.get("name") == name]
    return sub


def identity_config(cfg: DictConfig) -> dict:
    """The parts of ``cfg`` that can change a stage's output (not ``parallel``, retries, paths)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    for dotted in _NOT_FINGERPRINTED:
        _pop_dotted(data, dotted)
    data.pop("inference_dir", None)
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def fingerprint(data: dict) -> str:
    """sha256 of a plain dict in canonical JSON form."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _pop_dotted(data: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(leaf, None)
