"""Config values are typed as ESPnet3 types them (issue 49, item 1).

ESPnet3 reads its YAML files with ``OmegaConf.load``, whose loader is not PyYAML's ``safe_load``:
``1e-3`` is a float there, a date stays a string, a key written twice is an error. Command-line
overrides are typed by Hydra's override grammar (``k=yes`` is the string ``'yes'``, ``k='1e-3'`` a
string, ``k=[1,2]`` a list). Each row here is loaded through our ``load_config`` and compared, type
and value, with what OmegaConf or Hydra itself gives. ``SCALARS`` is shared with
tests/realespnet/test_config_typing_espnet.py, which compares it with the installed ESPnet3's loader.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from espnet3_prefect import ConfigError, load_config
from espnet3_prefect.config.load import apply_override, parse_override

# (label, the YAML text of one value): every row becomes ``value: <text>`` in a file of its own.
SCALARS = [
    ("exp lower minus", "1e-3"),
    ("exp upper plus", "1E+6"),
    ("exp no sign", "1e3"),
    ("exp upper minus", "2E-1"),
    ("exp negative", "-1e-3"),
    ("exp plus sign", "+1e3"),
    ("exp with dot", "1.5e3"),
    ("exp trailing dot", "1.e3"),
    ("exp leading dot", ".5e-3"),
    ("exp leading dot unsigned", ".5e3"),
    ("exp full", "1.0e+3"),
    ("exp avogadro", "6.02e23"),
    ("exp underscore", "1_000e3"),
    ("inf", ".inf"),
    ("minus inf", "-.inf"),
    ("plus inf", "+.inf"),
    ("Inf", ".Inf"),
    ("INF", ".INF"),
    ("nan", ".nan"),
    ("NaN", ".NaN"),
    ("bare inf", "inf"),
    ("bare nan", "nan"),
    ("null", "null"),
    ("Null", "Null"),
    ("NULL", "NULL"),
    ("tilde", "~"),
    ("empty", ""),
    ("true", "true"),
    ("True", "True"),
    ("TRUE", "TRUE"),
    ("false", "false"),
    ("yes", "yes"),
    ("Yes", "Yes"),
    ("on", "on"),
    ("On", "On"),
    ("off", "off"),
    ("No", "No"),
    ("no", "no"),
    ("y", "y"),
    ("n", "n"),
    ("double quoted exp", '"1e-3"'),
    ("single quoted exp", "'1e-3'"),
    ("quoted int", '"123"'),
    ("quoted octal-looking", "'017'"),
    ("quoted true", '"true"'),
    ("quoted null", "'null'"),
    ("date", "2001-12-14"),
    ("datetime iso", "2001-12-14t21:59:43.10-05:00"),
    ("datetime spaced", "2001-12-14 21:59:43.10 -5"),
    ("octal-looking", "017"),
    ("octal 0o", "0o17"),
    ("leading zeros", "0017"),
    ("not octal", "08"),
    ("hex", "0x1F"),
    ("hex lower", "0xff"),
    ("binary", "0b101"),
    ("int underscore", "1_000"),
    ("float underscore", "1_000.5"),
    ("sexagesimal", "1:20"),
    ("sexagesimal float", "1:20.5"),
    ("sexagesimal long", "190:20:30"),
    ("int", "3"),
    ("minus int", "-3"),
    ("plus int", "+3"),
    ("zero", "0"),
    ("float", "3.0"),
    ("float trailing dot", "3."),
    ("minus zero", "-0.0"),
    ("version-looking", "1.2.3"),
    ("word", "abc"),
    ("path", "/data/x.scp"),
    ("flow list", "[1e-3, 2E+1, yes, 2001-12-14, '1e-3']"),
    ("flow map", "{lr: 1e-3, day: 2001-12-14, on: 1}"),
    ("block list", "\n  - 1e-3\n  - .inf\n  - 017"),
    ("nested map", "\n  optim:\n    lr: 5E-4\n    betas: [0.9, 0.98]"),
]


def write_value(folder: Path, text: str) -> Path:
    path = folder / "value.yaml"
    path.write_text(f"value: {text}\n", encoding="utf-8")
    return path


def plain(value: Any) -> Any:
    """A loaded value as plain Python (containers resolved), for comparing one side with another."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def assert_same(ours: Any, theirs: Any, where: str = "value") -> None:
    """Equal in type and value, nan equal to nan, containers compared element by element."""
    assert type(ours) is type(theirs), f"{where}: ours {ours!r} ({type(ours).__name__}), theirs {theirs!r}"
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, float) and math.isnan(theirs):
        assert math.isnan(ours), f"{where}: ours {ours!r}, theirs nan"
    else:
        assert ours == theirs, f"{where}: ours {ours!r}, theirs {theirs!r}"


@pytest.mark.parametrize("text", [row[1] for row in SCALARS], ids=[row[0] for row in SCALARS])
def test_a_yaml_value_is_typed_as_omegaconf_loads_it(tmp_path, text):
    path = write_value(tmp_path, text)
    assert_same(plain(load_config([path]).value), plain(OmegaConf.load(path).value))


def test_the_rows_that_yaml_1_1_typed_otherwise():
    """The reason for this file: what ``yaml.safe_load`` got wrong, pinned to ESPnet3's answer."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        got = {text: load_config([write_value(Path(folder), text)]).value for text in ("1e-3", "1E+6", "2001-12-14")}
    assert got == {"1e-3": 0.001, "1E+6": 1000000.0, "2001-12-14": "2001-12-14"}


def test_several_files_merge_with_the_same_typing(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("optim: {lr: 1e-3, eps: 1E-8}\nday: 2001-12-14\n")
    over = tmp_path / "over.yaml"
    over.write_text("optim: {lr: 5e-4}\n")
    cfg = load_config([base, over])
    assert_same(plain(cfg), {"optim": {"lr": 0.0005, "eps": 1e-08}, "day": "2001-12-14"})


# Override forms: each row is applied to BASE and compared with Hydra's own reading of it.
BASE = {"a": 0.5, "k": 0, "x": 1, "model": {"ctc": 0.3}, "name": "run", "lr": "???"}
OVERRIDES = [
    "a=1e-3",
    "a=1E+6",
    "a=-2.5e-1",
    "+model.ctc_weight=2e-1",
    "+model.ctc=2e-1",
    "++x=3",
    "++new.deep.key=1e-3",
    "k=[1,2]",
    "k=[1e-3, yes, '1e-3', [a, b]]",
    "k={a: 1}",
    "k={lr: 1e-3, tags: [x, y]}",
    "k=[]",
    "k={}",
    "k=null",
    "k=NULL",
    "k='1e-3'",
    'k="1e-3"',
    "k=yes",
    "k=no",
    "k=on",
    "k=true",
    "k=False",
    "k=2001-12-14",
    "k=017",
    "k=0o17",
    "k=0x1F",
    "k=1_000",
    "k=1:20",
    "k=.inf",
    "k=inf",
    "k=-inf",
    "k=nan",
    "k=1.",
    "k=.5",
    "k=+1",
    "k=",
    "k=''",
    "k=exp/run 1",
    "k='a,b=c(d)'",
    "k=/d/a\\,b",
    "k=str(1)",
    "k=int(2.7)",
    "k=${name}",
    "k=${name}/x",
    "k=${oc.env:HOME,/tmp}",
    "k='${name}'",
    "lr=1e-4",
]


def hydra_value(item: str) -> Any:
    [override] = OverridesParser.create().parse_overrides([item])
    return override.value()


@pytest.mark.parametrize("item", OVERRIDES)
def test_an_override_is_typed_as_hydra_types_it(item):
    cfg = OmegaConf.create(BASE)
    apply_override(cfg, item)
    key = parse_override(item).key
    ours = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        ours = ours[part]
    assert_same(ours, hydra_value(item), item)


def test_interpolations_in_overrides_resolve_in_load_config(tmp_path, monkeypatch):
    monkeypatch.setenv("E3P_TYPING_HOME", "/home/x")
    path = tmp_path / "c.yaml"
    path.write_text("name: run\nk: 0\nlr: 0.1\n")
    cfg = load_config([path], ["k=${name}/x", "+home=${oc.env:E3P_TYPING_HOME}", "lr=2e-1"])
    assert (cfg.k, cfg.home, cfg.lr) == ("run/x", "/home/x", 0.2)


@pytest.mark.parametrize(
    "item, action, key",
    [
        ("k=1", "set", "k"),
        ("+k=1", "add", "k"),
        ("++k=1", "force_add", "k"),
        ("~k", "delete", "k"),
        ("~k=1", "delete", "k"),
        ("a.b.c=1", "set", "a.b.c"),
    ],
)
def test_override_actions_are_hydras(item, action, key):
    [override] = OverridesParser.create().parse_overrides([item])
    assert override.key_or_group == key
    assert {"CHANGE": "set", "ADD": "add", "FORCE_ADD": "force_add", "DEL": "delete"}[override.type.name] == action
    assert parse_override(item)[:2] == (action, key)


def test_delete_add_and_force_add(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: {b: 1, c: 2}\nk: 3\nlr: ???\n")
    cfg = load_config([path], ["~a.b", "~k=3", "+n=1e-3", "++a.c=2e-1", "+k=yes", "lr=1e-4"])
    assert_same(plain(cfg), {"a": {"c": 0.2}, "lr": 0.0001, "n": 0.001, "k": "yes"})
    assert "a" not in load_config([path], ["~a"])


def assert_one_line_error(call, *fragments: str) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text
    return text


def test_a_missing_key_needs_plus(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: {b: 1}\n")
    assert_one_line_error(
        lambda: load_config([path], ["a.c=1e-3"]),
        "override 'a.c=1e-3': key 'a.c' is not in the config (use +a.c=... to add it)",
    )
    assert_one_line_error(
        lambda: load_config([path], ["~a.nope"]), "override '~a.nope': key 'a.nope' is not in the config"
    )
    assert load_config([path], ["+a.c=1e-3"]).a.c == 0.001


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("k=a'b", "does not follow Hydra's override grammar"),
        ("k=~/x", "does not follow Hydra's override grammar"),
        ("k==", "does not follow Hydra's override grammar"),
        ("k=a=b", "does not follow Hydra's override grammar"),
        ("k=é", "does not follow Hydra's override grammar"),
        ("k=nope(1)", "does not follow Hydra's override grammar"),
        ("k=1,2", "a sweep over several values is not supported here"),
        ("k=choice(1,2)", "a sweep over several values is not supported here"),
        ("k=range(3)", "a sweep over several values is not supported here"),
        ("k@pkg=1", "'@pkg' (a Hydra package) is not supported here"),
        ("k", "is not of the form key=value"),
        ("=1", "has an empty key"),
        ("+=1", "has an empty key"),
        ("~", "has an empty key"),
        ("~k=4", "key 'k' is 3, not 4; nothing deleted"),
        ("k.sub=1", "override 'k.sub=1': "),
    ],
)
def test_a_bad_override_is_one_line_naming_it(item, fragment):
    cfg = OmegaConf.create({"k": 3})
    text = assert_one_line_error(lambda: apply_override(cfg, item), fragment)
    assert repr(item) in text
    assert cfg == OmegaConf.create({"k": 3})  # nothing changed


def test_a_quoted_value_passes_what_the_grammar_refuses():
    cfg = OmegaConf.create({"k": 3})
    for item, value in (("k='~/x'", "~/x"), ("k='é'", "é"), ("k='1,2'", "1,2"), ("k='it\\'s'", "it's")):
        apply_override(cfg, item)
        assert_same(cfg.k, value, item)
        assert_same(cfg.k, hydra_value(item), item)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a: 1\nb: 2\na: 3\n", "duplicate key 'a' (line 3)"),
        ("m:\n  x: 1\n  x: 2\n", "duplicate key 'x' (line 3)"),
        ("a: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "top level must be a mapping, got list"),
        ("just text\n", "top level must be a mapping, got str"),
        ("defaults:\n  - base\n", "defaults: lists are not supported"),
        ("day: !!timestamp 2001-12-14\n", "day"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    message = assert_one_line_error(lambda: load_config([path]), fragment)
    assert str(path) in message


def test_self_name_and_relative_paths_are_still_rewritten_per_file(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "tokens.txt").write_text("a\nb\n")
    path = tmp_path / "conf" / "inference.yaml"
    path.write_text("tag: ${self_name:}\nwords: ${load_line:tokens.txt}\nlr: 1e-3\n")
    cfg = load_config([path])
    assert (cfg.tag, list(cfg.words), cfg.lr) == ("inference", ["a", "b"], 0.001)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1e-3",
        "yes",
        "null",
        "/exp/a,b",
        "~/exp",
        "/exp/modèle.pth",
        "it's",
        "a\\",
        "a\\'b",
        "C:\\dir\\x",
        "k=v [x]",
    ],
)
def test_a_quoted_value_reads_back_as_the_same_string(text):
    from espnet3_prefect.config.load import quote_override_value

    item = "+k=" + quote_override_value(text)
    assert_same(hydra_value(item), text, item)
    cfg = OmegaConf.create({})
    apply_override(cfg, item)
    assert_same(cfg.k, text, item)
