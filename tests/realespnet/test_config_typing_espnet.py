"""Our config values against the installed ESPnet3 202611's own loader (issue 49, item 1).

The same YAML table as tests/unit/test_config_typing.py, read by ``espnet3.utils.config_utils``: the
per-file loader (``load_config_with_defaults``) and the launcher's (``load_and_merge_config``, the
recipe TEMPLATE's defaults under the file). Both must give our types and values.

ESPnet3's launcher (``espnet3.systems.launch``) takes no ``key=value`` overrides: its argument parser
knows ``--stages``, ``--<role>_config``, ``--dry_run`` and ``--write_requirements`` and refuses
anything else. Our overrides follow Hydra's override grammar instead (tests/unit/test_config_typing.py
compares them with it); the last test here notices the day the launcher starts taking overrides.

Quick (seconds): it runs in the real-espnet layer's ``-m "realespnet or not slow"``. Without espnet3
it skips; with ``E3P_REQUIRE_REAL_ESPNET=1`` it fails instead.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from espnet3_prefect import load_config
from tests.unit.test_config_typing import SCALARS, assert_same, plain, write_value

from .conftest import REQUIRE_VAR, SETUP

pytestmark = pytest.mark.realespnet

TEMPLATE = "egs3.TEMPLATE.esp2_asr"


def _require(module: str):
    """``module`` imported; a skip without it, a failure with E3P_REQUIRE_REAL_ESPNET=1."""
    if os.environ.get(REQUIRE_VAR) == "1":
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            pytest.fail(f"{module} is not importable ({exc}); run: {SETUP}", pytrace=False)
    return pytest.importorskip(module, reason=f"the real ESPnet 202611 is not installed here; run: {SETUP}")


@pytest.fixture(scope="module")
def config_utils():
    return _require("espnet3.utils.config_utils")


@pytest.mark.parametrize("text", [row[1] for row in SCALARS], ids=[row[0] for row in SCALARS])
def test_espnet3s_file_loader_types_a_value_as_we_do(tmp_path, config_utils, text):
    path = write_value(tmp_path, text)
    theirs = config_utils.load_config_with_defaults(str(path), resolve=True)
    assert_same(plain(load_config([path]).value), plain(theirs.value))


def test_espnet3s_launcher_loader_types_the_table_as_we_do(tmp_path, config_utils):
    """The whole table in one ``inference.yaml``, read as the launcher reads it (TEMPLATE under it)."""
    _require(TEMPLATE)
    rows = "".join(f"  row{i}: " + text.replace("\n", "\n  ") + "\n" for i, (_, text) in enumerate(SCALARS))
    path = tmp_path / "conf" / "inference.yaml"
    path.parent.mkdir()
    path.write_text("typing:\n" + rows, encoding="utf-8")
    ours = plain(load_config([path]).typing)
    merged = config_utils.load_and_merge_config(path, config_name="inference.yaml", default_package=TEMPLATE)
    assert_same(ours, plain(merged.typing), "typing")


def test_espnet3s_launcher_takes_no_key_value_overrides(tmp_path):
    _require("espnet3")
    contract = _require("espnet3.contract.stages")
    launch = _require("espnet3.systems.launch")

    class OneStage:
        stages = (contract.StageSpec(name="infer", config="inference"),)

    parser = launch.build_parser(OneStage)
    args = parser.parse_args(["--stages", "infer", "--inference_config", str(tmp_path / "inference.yaml")])
    assert args.inference_config == Path(tmp_path / "inference.yaml")
    with pytest.raises(SystemExit):
        parser.parse_args(["--stages", "infer", "--inference_config", "c.yaml", "optim.lr=1e-3"])
    assert "parse_known_args" not in Path(launch.__file__).read_text(encoding="utf-8")
