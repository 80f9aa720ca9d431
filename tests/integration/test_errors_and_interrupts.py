"""What a user meets when things go wrong: bad input is never retried and stops the run at once with
one line; a typo in input_key fails before any shard; Ctrl-C keeps every finished shard."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, start_infer
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow


def run_infer(tmp_path, cfg: dict, overrides=()):
    from espnet3_prefect.flows.infer import infer

    return infer(config=[str(write_yaml(tmp_path / "inference.yaml", cfg))], overrides=list(overrides))


def test_bad_input_is_not_retried_and_stops_the_other_shards(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=40, num_shards=8, n_workers=1, bad={1: "no_input"})
    cfg["model"]["sleep_s"] = 0.05
    cfg["runner"]["retries"] = 2  # would be 3 attempts per shard if bad input were retried
    with pytest.raises(Exception) as err:
        run_infer(tmp_path, cfg)
    message = str(err.value)
    assert "item 1 (utt_id='utt00001'): dataset item has no input_key 'x'" in message
    assert "not retried" in message and "\n" not in message
    calls = [int(line.split()[1]) for line in read_lines(tmp_path / "forward.log")]
    assert calls.count(0) == 1  # the failing shard ran once: no retry
    assert len(calls) < 40  # the run stopped instead of running every shard into the failure


def test_input_key_typo_fails_once_before_any_shard(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=12, num_shards=3)
    with pytest.raises(
        Exception,
        match="input_key: 'audio' is not a field of the items of test set 'test_a' "
        r"\(item 0 has: text, utt_id, x\)",
    ):
        run_infer(tmp_path, cfg, overrides=["input_key=audio"])
    assert read_lines(tmp_path / "forward.log") == []  # no shard ran


def test_ctrl_c_keeps_every_finished_shard(tmp_path):
    cfg = toy_config(tmp_path, n=24, num_shards=8, n_workers=1)
    cfg["model"]["sleep_s"] = 0.3  # ~0.9 s per shard
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(ESPNET3_PREFECT_HOME=str(tmp_path / "home"))
    # Ctrl-C as a terminal sends it: to a process whose SIGINT is not ignored. A test run started in the
    # background of a non-interactive shell (`.ci/run &`) inherits SIGINT ignored, Python keeps it so
    # (as `nohup ... &` users expect) and the CLI would never see it: the child gets the default.
    # A terminal's Ctrl-C goes to its whole foreground process group (the local workers too): the CLI
    # runs in a group of its own here, and the group gets the signal.
    proc = start_infer(path, tmp_path, env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = tmp_path / "inference/test_a"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(out.glob("split.*/done"))) < 3 and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert stderr.rstrip().splitlines()[-1] == (
        "error: interrupted; finished shards are kept and a re-run resumes from them"
    )
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr  # no worker's traceback
    for teardown in (
        "Crash detected",
        "Finished in state Crashed",
        "Async instruction",
        "EventsWorker",
        "cancel_jobs_hook",
    ):
        assert teardown not in stderr, stderr  # after the Ctrl-C: our one line, nothing of the teardown
    done = sorted(int(p.parent.name.split(".")[1]) for p in out.glob("split.*/done"))
    assert 3 <= len(done) < 8, done  # interrupted mid-run, every finished shard marked done
    (tmp_path / "forward.log").unlink()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{8 - len(done)} shards run, {len(done)} cached" in proc.stdout
    rerun = sorted({int(line.split()[1]) // 3 for line in read_lines(tmp_path / "forward.log")})
    assert rerun == [i for i in range(8) if i not in done]  # only the unfinished shards ran again
