"""What the terminal shows: the summary once, a progress line that starts before the work does, and
no server for a run with nothing to do."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env

pytestmark = pytest.mark.slow


def test_summary_printed_once_and_a_finished_stage_starts_no_server(tmp_path):
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=8, num_shards=2))
    home = tmp_path / "home"
    first = subprocess.run(
        [*CLI, "infer", "--config", str(cfg)],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    line = "test_a: 8 items, 2 shards run, 0 cached"
    assert first.stdout.count(line) == 1 and line not in first.stderr, first.stderr[-3000:]
    assert "Prefect API" in first.stderr
    # One line per shard at the default level (a task run's "Finished in state Completed()" is dropped;
    # the workers print these lines themselves, so this also checks the filter reached them).
    assert "split.0: 4 items" in first.stderr and "split.1: 4 items" in first.stderr
    assert "Task run 'run-shard-test_a-0' - Finished in state" not in first.stderr, first.stderr[-3000:]

    again = subprocess.run(
        [*CLI, "infer", "--config", str(cfg)],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "test_a: 8 items, 0 shards run, 2 cached" in again.stdout
    assert "Prefect API" not in again.stderr and not (home / "server.json").exists()
    assert again.stderr.strip() == (
        "nothing to run: every test set is done and verified (no server started, no flow run)"
    )

    # A changed config is work again: the flow runs (and says why); --verbose shows every Prefect line.
    changed = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "model.scale=4", "--verbose"],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert changed.returncode == 0 and "Prefect API" in changed.stderr, changed.stderr[-3000:]
    assert "test_a: 8 items, 2 shards run, 0 cached" in changed.stdout
    assert "Task run 'run-shard-test_a-0' - Finished in state Completed()" in changed.stderr


class _Recorder:
    """A stderr that notes, for each progress line, how many shards had their done marker then."""

    def __init__(self, out_dir):
        self.out_dir, self.lines = out_dir, []

    def write(self, text):
        for part in text.splitlines():
            match = re.search(r"test_a: (\d+)/(\d+) shards", part)
            if match:
                self.lines.append((int(match.group(1)), len(list(self.out_dir.glob("split.*/done")))))
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


def test_progress_line_starts_before_any_shard_finishes(prefect_server, tmp_path, monkeypatch):
    from espnet3_prefect.flows.infer import infer

    cfg = toy_config(tmp_path, n=64, num_shards=32)
    recorder = _Recorder(tmp_path / "inference/test_a")
    monkeypatch.setattr(sys, "stderr", recorder)
    [summary] = infer(config=[str(write_yaml(tmp_path / "inference.yaml", cfg))])
    assert summary["shards_run"] == 32
    assert recorder.lines[0] == (0, 0)  # 0 % was shown before any shard could finish
    assert recorder.lines[-1][0] == 32
    assert all(shown <= on_disk for shown, on_disk in recorder.lines)  # never ahead of the markers
