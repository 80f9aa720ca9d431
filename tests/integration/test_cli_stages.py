"""`espnet3-prefect metrics`, `evaluate` and `infer --detach` from the shell (embedded default)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import ROOT, write_yaml
from tests.helpers.procs import CLI, cli_env
from tests.integration.test_metrics_evaluate import WER_T, known_errors_dir, metrics_cfg

pytestmark = pytest.mark.slow


def test_cli_metrics_scores_and_stops_its_server(tmp_path):
    out = known_errors_dir(tmp_path)
    cfg = metrics_cfg(tmp_path, out)
    only_wer = f"metrics=[{{metric: {{_target_: {WER_T}}}, inputs: {{ref: ref, hyp: hyp}}}}]"
    proc = subprocess.run(
        [*CLI, "metrics", "--config", str(cfg), only_wer],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'test_a: {WER_T}: {{"WER": 75.0}}' in proc.stdout
    assert list(json.loads((out / "metrics.json").read_text())) == [WER_T]  # the override dropped CER
    assert not (tmp_path / "home" / "server.json").exists()

    # nothing changed: answered from metrics.json and its record, no server started, same output
    again = subprocess.run(
        [*CLI, "metrics", "--config", str(cfg), only_wer],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to run" in again.stderr and "Prefect API" not in again.stderr, again.stderr[-3000:]
    assert again.stdout == proc.stdout


def test_cli_metrics_reads_dataset_columns_through_the_inference_config(tmp_path):
    from tests.helpers.wordrecipe import word_config

    (tmp_path / "model.ckpt").write_text("0\n")
    i = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path, n=2))
    (tmp_path / "inference" / "dev").mkdir(parents=True)
    (tmp_path / "inference" / "dev" / "text.scp").write_text("w0000 the cat sat\nw0001 on the mat\n")
    m = write_yaml(
        tmp_path / "metrics.yaml",
        {
            "metrics": [  # inference_dir comes from the inference config
                {"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:text", "hyp": "text"}}
            ]
        },
    )
    proc = subprocess.run(
        [*CLI, "metrics", "--config", str(m), "--inference-config", str(i), "dataset.test.0.n=2"],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'dev: {WER_T}: {{"WER": 14.29}}' in proc.stdout  # "today" deleted: 1 of 7 words
    assert (
        tmp_path / "inference" / "dev" / "dataset" / "text.scp"
    ).read_text() == "w0000 the cat sat\nw0001 on the mat today\n"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["metrics", "--config", "{m}", "metrics=[]"], "error: metrics: must be a non-empty list"),
        (
            ["evaluate", "--config", "{i}", "--metrics-config", "{m}", "metrics.0.metric._target_=no.Such"],
            "error: metrics[0].metric._target_: cannot import 'no.Such'",
        ),
        (
            ["evaluate", "--config", "{i}", "parallel.env=slrum", "--metrics-config", "{m}"],
            "error: parallel.env: unknown backend 'slrum'",
        ),
    ],
)
def test_cli_bad_configs_exit_2_on_one_line_before_any_server(tmp_path, argv, expected):
    from tests.helpers.wordrecipe import word_config

    (tmp_path / "model.ckpt").write_text("0\n")
    i = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path))
    m = metrics_cfg(tmp_path, tmp_path / "inference")
    home = tmp_path / "home"
    proc = subprocess.run(
        [*CLI, *[a.format(i=i, m=m) for a in argv]], env=cli_env(home), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(expected)
    assert not (home / "server.json").exists() and not (tmp_path / "inference").exists()


def test_cli_detach_without_a_server_says_how_to_get_one(tmp_path):
    proc = subprocess.run(
        [*CLI, "infer", "--detach", "--config", str(ROOT / "recipes/dtmf/conf/inference.yaml")],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "error: no Prefect server to submit to: run `espnet3-prefect deploy-local` "
        "(or set PREFECT_API_URL to a server with the deployments)"
    )
