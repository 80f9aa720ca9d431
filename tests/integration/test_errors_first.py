"""Errors a user meets first, on one line, before anything starts (issue 25): a misspelt top-level key in
the CLI and the drop-in, a drop-in call without the main guard, a typo in input_key on the demo's
data-generation path, local_gpu without a GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, ROOT, cli_env

pytestmark = pytest.mark.slow


def _lines(text: str) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()]


@pytest.mark.parametrize(
    "given, likely",
    [(["batch_sise: 16"], "batch_size"), (["+batch_sise=16"], "batch_size"), (["paralel: {env: local}"], "parallel")],
)
def test_cli_misspelt_key_is_one_line_exit_2_no_server(tmp_path, given, likely):
    path = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=4))
    args = [str(path)]
    if given[0].startswith("+"):
        args += given
    else:  # a YAML merged over the config, as a user's override file is
        extra = tmp_path / "extra.yaml"
        extra.write_text(given[0] + "\n")
        args.append(str(extra))
    proc = subprocess.run(
        [*CLI, "infer", "--config", *args],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    key = given[0].lstrip("+").split(":")[0].split("=")[0]
    assert proc.returncode == 2, proc.stderr
    assert _lines(proc.stderr) == [
        f"error: {key}: not a config key; did you mean {likely}? (a key of your own: list it under allow_keys:)"
    ]
    assert not (tmp_path / "inference").exists() and not (tmp_path / "home/server.json").exists()


def _script(tmp_path, body: str):
    path = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=4, n_workers=1, num_shards=1))
    script = tmp_path / "run_infer.py"
    script.write_text(
        textwrap.dedent(f"""\
        from omegaconf import OmegaConf
        from espnet3_prefect import infer
        config = OmegaConf.load({str(path)!r})
        """)
        + textwrap.dedent(body)
    )
    return script


def test_dropin_without_main_guard_says_so_on_one_line(tmp_path):
    script = _script(tmp_path, "infer(config)\n")
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _lines(proc.stderr) == [
        f"error: infer() was called at the top level of {script}; put the script's top-level code under "
        f'`if __name__ == "__main__":` (local Dask workers re-import the main script, as with any '
        f"multiprocessing program)"
    ]
    assert not (tmp_path / "inference").exists() and not (tmp_path / "home/server.json").exists()


def test_dropin_misspelt_key_fails_before_anything_starts(tmp_path):
    script = _script(
        tmp_path,
        """\
        if __name__ == "__main__":
            config.batch_sise = 16
            infer(config)
        """,
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "espnet3_prefect.errors.ConfigError: batch_sise: not a config key; did you mean batch_size? "
        "(a key of your own: list it under allow_keys:)"
    )
    assert "Prefect" not in proc.stderr and not (tmp_path / "home/server.json").exists()


def test_demo_input_key_typo_is_printed_once_before_a_server_starts(tmp_path):
    """On a fresh clone the demo makes its audio first, then checks input_key: one line, exit 2."""
    proc = subprocess.run(
        [
            *CLI,
            "infer",
            "--config",
            str(ROOT / "recipes/dtmf/conf/inference.yaml"),
            "input_key=speach",
            f"exp_dir={tmp_path / 'exp'}",
        ],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Prefect API" not in proc.stderr and "Traceback" not in proc.stderr
    errors = [line for line in _lines(proc.stderr) if "speach" in line]
    assert errors == [
        "error: input_key: 'speach' is not a field of the items of test set 'test_clean' "
        "(item 0 has: speech, text, utt_id)"
    ], proc.stderr
    assert not (tmp_path / "home/server.json").exists()
