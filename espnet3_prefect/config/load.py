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
from typing import Any, NamedTuple

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader
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

    Files are read as ESPnet3 reads them (OmegaConf's YAML loader: ``1e-3`` is a float, a date stays
    a string) and overrides are parsed with Hydra's override grammar (:func:`apply_override`).

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


def parse_yaml(text: str, source: Any = "<string>") -> Any:
    """YAML text read the way ESPnet3 reads its config files (``OmegaConf.load``'s loader).

    That loader is PyYAML's safe loader with OmegaConf's changes: a float needs no dot (``1e-3``,
    ``2E+6``), a date is a plain string, and a key written twice in one mapping is an error (a
    one-line :class:`ConfigError` naming ``source`` and the key).

    >>> parse_yaml("lr: 1e-3\\nday: 2001-12-14\\nbig: 1E+6\\nflag: yes\\nmode: 017")
    {'lr': 0.001, 'day': '2001-12-14', 'big': 1000000.0, 'flag': True, 'mode': 15}
    >>> parse_yaml("a: 1\\na: 2", "c.yaml")
    Traceback (most recent call last):
    ...
    espnet3_prefect.errors.ConfigError: c.yaml: duplicate key 'a' (line 2)
    """
    try:
        return yaml.load(text, Loader=get_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.constructor.ConstructorError as exc:
        problem = exc.problem or ""
        if problem.startswith("found duplicate key "):
            line = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark is not None else ""
            key = problem.removeprefix("found duplicate key ")
            raise ConfigError(f"{source}: duplicate key {key!r}{line}") from None
        raise ConfigError(f"{source}: not valid YAML: {one_line(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {one_line(exc)}") from None


def read_yaml(path: Path) -> DictConfig:
    """One config file read and checked (a mapping, no ``defaults:`` list), its file resolvers applied."""
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise ConfigError(f"config file not found: {path}{where}")
    data = parse_yaml(path.read_text(encoding="utf-8"), path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    if "defaults" in data:
        raise ConfigError(
            f"{path}: defaults: lists are not supported; pass the files to merge as --config base.yaml override.yaml"
        )
    _register_resolvers()
    try:
        return OmegaConf.create(_per_file(data, path.resolve()))
    except OmegaConfBaseException as exc:  # a value OmegaConf cannot hold (e.g. an explicit !!timestamp)
        raise ConfigError(f"{path}: {one_line(exc)}") from None


class Override(NamedTuple):
    """One command-line override as Hydra's grammar reads it.

    ``action``: ``"set"`` (``key=value``: the key must exist), ``"add"`` (``+key=value``),
    ``"force_add"`` (``++key=value``) or ``"delete"`` (``~key``, ``~key=value``). ``value`` is typed as
    Hydra types it; ``has_value`` is False for a bare ``~key``.
    """

    action: str
    key: str
    value: Any
    has_value: bool


_ACTIONS = {"CHANGE": "set", "ADD": "add", "FORCE_ADD": "force_add", "DEL": "delete"}


def parse_override(item: str) -> Override:
    """``item`` read with Hydra's override grammar, its value typed as Hydra types it.

    >>> parse_override("+model.ctc_weight=2e-1")
    Override(action='add', key='model.ctc_weight', value=0.2, has_value=True)
    >>> parse_override("k=yes").value, parse_override("k='1e-3'").value, parse_override("k=[1, a]").value
    ('yes', '1e-3', [1, 'a'])
    >>> parse_override("~parallel")
    Override(action='delete', key='parallel', value=None, has_value=False)

    A sweep (``k=1,2``), a package (``k@pkg=1``) or anything outside the grammar is a one-line
    :class:`ConfigError` naming the override:

    >>> parse_override("k=1,2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    espnet3_prefect.errors.ConfigError: override 'k=1,2': a sweep over several values is not supported here; ...
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    if not isinstance(item, str):
        raise ConfigError(f"override {item!r} is not a string of the form key=value")
    if not item.startswith("~") and "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    if not item.lstrip("+~").split("=", 1)[0].strip():
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        [parsed] = OverridesParser.create().parse_overrides([item])
    except HydraException as exc:
        lines = [line for line in str(exc).splitlines() if line.strip() and not line.startswith("See https://")]
        raise ConfigError(
            f"override {item!r} does not follow Hydra's override grammar ({one_line(' '.join(lines))}); "
            "quote a value with special characters: key='...'"
        ) from None
    key = parsed.key_or_group
    if parsed.package is not None:
        raise ConfigError(f"override {item!r}: '@{parsed.package}' (a Hydra package) is not supported here")
    if parsed.value_type not in (None, ValueType.ELEMENT):
        raise ConfigError(
            f"override {item!r}: a sweep over several values is not supported here; for one value quote it "
            f"({key}='...') or give a list ({key}=[...])"
        )
    has_value = parsed.value_type is not None
    return Override(_ACTIONS[parsed.type.name], key, parsed.value() if has_value else None, has_value)


def quote_override_value(text: str) -> str:
    """``text`` quoted for an override, so Hydra's grammar reads it back as that very string.

    For code that builds ``key=value`` items from paths or names: a ``,`` would start a sweep, a
    ``~``, ``(`` or non-ASCII letter is outside the unquoted grammar, ``1e-3`` would be a float.

    >>> quote_override_value("/exp/modèle, v2 (it's)")
    "'/exp/modèle, v2 (it\\\\'s)'"
    >>> parse_override("+ckpt=" + quote_override_value("/exp/modèle, v2 (it's)")).value
    "/exp/modèle, v2 (it's)"
    """
    # Hydra's quoted strings: a quote is escaped with a backslash, and the backslashes just before
    # a quote (or the closing one) come in pairs, each pair one backslash; other backslashes are kept.
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def _has_key(cfg: DictConfig, key: str) -> bool:
    """Whether dotted ``key`` is in ``cfg`` (a ``???`` value counts; nothing is resolved)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    if isinstance(node, DictConfig):
        return leaf in node.keys()
    if isinstance(node, ListConfig):
        return leaf.isdigit() and int(leaf) < len(node)
    return False


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def apply_override(cfg: DictConfig, item: str) -> None:
    """Apply one override to ``cfg`` in place, read with Hydra's override grammar (:func:`parse_override`).

    ``key=value`` changes a key that is there; ``+key=value`` and ``++key=value`` add or set one;
    ``~key`` deletes one (``~key=value``: only while it holds ``value``). The value replaces what was
    there (a mapping is not merged into the old one).

    >>> cfg = OmegaConf.create({"optim": {"lr": 0.1}, "tags": ["a"]})
    >>> for item in ("optim.lr=1e-3", "+model.ctc_weight=2e-1", "tags=[b, c]", "~optim"):
    ...     apply_override(cfg, item)
    >>> OmegaConf.to_container(cfg)
    {'tags': ['b', 'c'], 'model': {'ctc_weight': 0.2}}
    >>> apply_override(cfg, "model.ctc=0.3")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    espnet3_prefect.errors.ConfigError: override 'model.ctc=0.3': key 'model.ctc' is not in the config (use ...)
    """
    action, key, value, has_value = parse_override(item)
    if action == "delete":
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
        if not isinstance(node, DictConfig) or leaf not in node.keys():
            raise ConfigError(f"override {item!r}: key {key!r} is not in the config")
        if has_value and value is not None:
            current = _plain(OmegaConf.select(cfg, key, throw_on_resolution_failure=False))
            if current != value:
                raise ConfigError(f"override {item!r}: key {key!r} is {current!r}, not {value!r}; nothing deleted")
        del node[leaf]
        return
    if action == "set" and not _has_key(cfg, key):
        raise ConfigError(f"override {item!r}: key {key!r} is not in the config (use +{key}=... to add it)")
    try:
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"override {item!r}: {one_line(exc)}") from None


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
