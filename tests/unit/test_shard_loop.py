"""The shard loop drives any runner class through ESPnet3's public hooks only (in-process, no Dask)."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time

import pytest

from espnet3_prefect import BaseRunner, ConfigError, InferenceRunner, ItemError
from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.disk.marker import check_marker, read_marker
from espnet3_prefect.errors import is_retryable
from espnet3_prefect.pipeline.lock import LockedError, take_shard_lock
from espnet3_prefect.pipeline.plan import Shard, plan_shards
from espnet3_prefect.pipeline.shard import drive, process_shard

DATA = [{"utt_id": f"u{i}", "x": i} for i in range(7)]


class PlainRunner:
    """No base class at all: only forward and the writer hooks (a 'plain class with the right methods')."""

    calls: list = []

    @staticmethod
    def forward(idx, dataset, model, **env):
        items = idx if isinstance(idx, list) else [idx]
        return [{"utt_id": dataset[i]["utt_id"], "y": model(dataset[i]["x"])} for i in items]

    @staticmethod
    def open_writers(shard_dir, shard_id, output_dir, shard_subdir, **env):
        PlainRunner.calls.append(("open", shard_dir.name, shard_id, output_dir, shard_subdir, sorted(env)))
        return {"out": (shard_dir / "y.txt").open("w")}

    @staticmethod
    def write_record(writers, result, state, shard_id, **env):
        PlainRunner.calls.append(("write", shard_id, sorted(env)))
        for r in result:
            writers["out"].write(f"{r['utt_id']} {r['y']}\n")

    @staticmethod
    def close_writers(writers, state, **env):
        writers["out"].close()
        return {"closed": True}


def _env(tmp_path, **extra):
    return {"dataset": DATA, "model": lambda x: x * 10, "output_dir": str(tmp_path), **extra}


def test_plain_class_gets_upstreams_hook_arguments_and_env(tmp_path):
    PlainRunner.calls = []
    assert drive(PlainRunner, [[0, 1], [2]], _env(tmp_path), 3) == []
    assert (tmp_path / "split.3/y.txt").read_text() == "u0 0\nu1 10\nu2 20\n"
    opened = PlainRunner.calls[0]
    assert opened[:5] == ("open", "split.3", 3, str(tmp_path), "")  # shard_subdir given even when unset
    assert opened[5] == ["dataset", "model"]
    assert PlainRunner.calls[1] == ("write", 3, ["dataset", "model", "output_dir"])


def test_class_state_hooks_are_used_when_the_class_has_them(tmp_path):
    seen = []

    class Recorder(BaseRunner):
        @staticmethod
        def forward(idx, **env):
            return idx

        @classmethod
        def reduce_state(cls, state, result, **env):
            seen.append((result, env["shard_id"]))
            return super().reduce_state(state, result, **env)

        @classmethod
        def finalize_state(cls, state, **env):
            seen.append(("records", state["records"]))
            return super().finalize_state(state, **env)

    drive(Recorder, [4, 5], _env(tmp_path), 0)
    assert seen == [(4, 0), (5, 0), ("records", [4, 5])]


def test_shard_subdir_places_the_shard_where_upstream_does(tmp_path):
    PlainRunner.calls = []
    drive(PlainRunner, [0], _env(tmp_path, shard_subdir="sub"), 1)
    assert (tmp_path / "sub/split.1/y.txt").read_text() == "u0 0\n"
    assert PlainRunner.calls[0][4] == "sub"


def test_failing_item_names_the_utterance_and_says_whether_a_retry_helps(tmp_path):
    class Bad(PlainRunner):
        @staticmethod
        def forward(idx, dataset, **env):
            if idx == 2:
                raise KeyError("speech")
            if idx == 3:
                raise OSError("nfs went away")
            return [{"utt_id": dataset[idx]["utt_id"], "y": 0}]

    with pytest.raises(ItemError, match=r"item 2 \(utt_id='u2'\): KeyError: 'speech'") as err:
        drive(Bad, [0, 1, 2], _env(tmp_path), 0)
    assert not is_retryable(err.value) and not is_retryable(pickle.loads(pickle.dumps(err.value)))
    with pytest.raises(ItemError) as err:
        drive(Bad, [3], _env(tmp_path), 0)
    assert is_retryable(pickle.loads(pickle.dumps(err.value)))


def test_skip_reruns_a_failing_batch_item_by_item_as_one_item_batches(tmp_path):
    calls = []

    class Flaky(PlainRunner):
        @staticmethod
        def forward(idx, dataset, **env):
            calls.append(idx)
            if 4 in idx:
                raise ValueError("bad sample")
            return [{"utt_id": dataset[i]["utt_id"], "y": i} for i in idx]

    failures = drive(Flaky, [[0, 1], [2, 3, 4], [5]], _env(tmp_path), 0, on_error="skip")
    assert calls == [[0, 1], [2, 3, 4], [2], [3], [4], [5]]
    assert failures == [{"idx": 4, "item": "item 4 (utt_id='u4')", "error": "ValueError: bad sample"}]
    assert (tmp_path / "split.0/y.txt").read_text() == "u0 0\nu1 1\nu2 2\nu3 3\nu5 5\n"


def test_run_shard_writes_in_place_marks_done_last_and_releases_the_lock(tmp_path):
    layout = StageLayout(tmp_path / "test_a")
    env = _env(layout.output_dir)
    [shard] = plan_shards("test_a", 5, 1, batch_size=2)
    (layout.shard_dir(0)).mkdir(parents=True)
    (layout.shard_dir(0) / "stale.txt").write_text("from an earlier attempt")
    summary = process_shard(PlainRunner, shard, env, layout, marker={"fingerprint": "f"})
    assert summary["items"] == 5 and summary["failed"] == 0
    assert sorted(os.listdir(layout.shard_dir(0))) == ["done", "y.txt"]  # stale file gone, lock released
    marker = read_marker(layout.shard_dir(0))
    assert set(marker["files"]) == {"y.txt"} and (marker["start"], marker["stop"]) == (0, 5)
    assert check_marker(layout.shard_dir(0), {"fingerprint": "f", "start": 0, "stop": 5}) is None


def test_a_shard_whose_forward_fails_is_never_marked_done(tmp_path):
    class Boom(PlainRunner):
        @staticmethod
        def forward(idx, **env):
            raise RuntimeError("cuda error")

    layout = StageLayout(tmp_path / "t")
    with pytest.raises(ItemError):
        process_shard(Boom, Shard("t", 0, 0, 2), _env(layout.output_dir), layout)
    assert not (layout.shard_dir(0) / "done").exists() and not (layout.shard_dir(0) / "lock").exists()


def test_shard_lock_of_a_live_other_runner_is_refused_unless_overwrite_is_allowed(tmp_path):
    lock = tmp_path / "split.0" / "lock"
    lock.parent.mkdir()
    lock.write_text(f"{os.getppid()}\n")  # upstream writes only the pid: a live process, no host
    with pytest.raises(LockedError, match="locked by pid .* another run is writing this shard"):
        take_shard_lock(lock, "run-1")
    assert "allow_overwrite_lock" in take_shard_lock(lock, "run-1", allow_overwrite=True)
    assert lock.read_text().splitlines()[0] == str(os.getpid())
    assert "this run's earlier attempt" in take_shard_lock(lock, "run-1")  # our own run's re-run


def test_shard_lock_of_a_killed_worker_not_yet_reaped_is_taken_over(tmp_path):
    """A killed worker whose parent died with it is a zombie until init reaps it (a second or more):
    it writes nothing, so its shard lock is taken over at once, not refused as a live writer's."""
    import socket

    pid = os.fork()
    if pid == 0:
        os._exit(0)  # exits at once; not waited for below: a zombie
    try:
        deadline = time.monotonic() + 10
        while open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        lock = tmp_path / "split.0" / "lock"
        lock.parent.mkdir()
        lock.write_text(f"{pid}\n{socket.gethostname()} run-0\n")
        assert take_shard_lock(lock, "run-1") == f"its holder (pid {pid}) is gone"
    finally:
        with contextlib.suppress(ChildProcessError):  # the check above may have reaped it
            os.waitpid(pid, 0)


def test_local_call_resumes_and_returns_what_merge_returns(tmp_path):
    class Counting(BaseRunner):
        runs = []

        @staticmethod
        def forward(idx, **env):
            Counting.runs.append(idx)
            return {"i": idx}

        @staticmethod
        def write_record(writers, result, state, **env):
            with open(os.path.join(state["shard_dir"], "r.jsonl"), "a") as out:
                out.write(json.dumps(result) + "\n")

        def merge(self, shard_dirs):
            return [json.loads(line) for d in shard_dirs for line in (d / "r.jsonl").read_text().splitlines()]

    class Provider:
        def build_env_local(self):
            return {}

    runner = Counting(Provider(), None, tmp_path)
    assert runner([3, 1, 2]) == [{"i": 3}, {"i": 1}, {"i": 2}]  # the given order, not sorted
    assert runner([3, 1, 2]) == [{"i": 3}, {"i": 1}, {"i": 2}] and Counting.runs == [3, 1, 2]  # resumed
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [s["items"] for s in manifest["shards"]] == [[3], [1], [2]]


def test_inference_runner_call_returns_true_like_upstream(tmp_path):
    class Provider:
        def build_env_local(self):
            return {
                "dataset": DATA,
                "model": lambda x: {"y": x},
                "input_key": "x",
                "idx_key": "utt_id",
                "output_keys": None,
            }

    def add_id(data, model_output, idx):
        return {"utt_id": data["utt_id"], **model_output}

    class WithId(InferenceRunner):
        @classmethod
        def forward(cls, idx, **env):
            return super().forward(idx, output_fn=add_id, **env)

    assert WithId(Provider(), batch_size=None, output_dir=tmp_path)(range(3)) is True
    assert (tmp_path / "y.scp").read_text() == "u0 0\nu1 1\nu2 2\n"


def test_no_output_dir_is_a_config_error():
    class R(BaseRunner):
        @staticmethod
        def forward(idx, **env):
            return idx

    with pytest.raises(ConfigError, match="output_dir: not set"):
        R(None)(range(2))


# -- a full disk and the shard lock -----------------------------------------------------------------


def test_empty_shard_lock_left_by_a_dead_run_does_not_block(tmp_path):
    """A run whose disk filled once left ``lock`` empty (its pid could not be written): no holder
    can be named, so once it is not brand new it is taken over, and the new lock says who holds it."""
    import socket

    lock = tmp_path / "split.4" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    os.utime(lock, (time.time() - 60, time.time() - 60))
    assert "it was empty" in take_shard_lock(lock, "run-2")
    assert lock.read_text() == f"{os.getpid()}\n{socket.gethostname()} run-2\n"


def test_shard_lock_of_a_live_other_holder_on_this_host_is_refused_naming_it(tmp_path):
    import socket

    lock = tmp_path / "split.0" / "lock"
    lock.parent.mkdir()
    lock.write_text(f"{os.getppid()}\n{socket.gethostname()} run-1\n")
    expected = f"locked by pid {os.getppid()} on {socket.gethostname()}, flow run run-1 \\(alive\\)"
    with pytest.raises(LockedError, match=expected) as caught:
        take_shard_lock(lock, "run-2")
    assert not is_retryable(caught.value)  # no 2 s / 10 s retries for a lock
    assert lock.read_text().startswith(f"{os.getppid()}\n")  # left as it was


def test_shard_lock_of_a_dead_pid_of_this_host_is_taken_over(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock = tmp_path / "split.0" / "lock"
    lock.parent.mkdir()
    lock.write_text(f"{dead.stdout.strip()}\n{socket.gethostname()} run-1\n")
    assert take_shard_lock(lock, "run-2") == f"its holder (pid {dead.stdout.strip()}) is gone"


def test_a_lock_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    import builtins
    import errno

    from espnet3_prefect.pipeline import lock as lock_module

    def full_open(path, mode="r", **kwargs):  # the lock's text goes to a full disk
        builtins.open(path, mode, **kwargs).close()
        return builtins.open("/dev/full", "w", **kwargs)

    monkeypatch.setattr(lock_module, "open", full_open, raising=False)
    lock = tmp_path / "split.0" / "lock"
    with pytest.raises(OSError) as caught:
        take_shard_lock(lock, "run-1")
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(lock)
    assert os.listdir(lock.parent) == []  # neither the lock nor its temporary file


def test_release_leaves_a_lock_another_process_took_over(tmp_path):
    from espnet3_prefect.pipeline.lock import release_shard_lock

    lock = tmp_path / "split.0" / "lock"
    lock.parent.mkdir()
    lock.write_text(f"{os.getppid()}\nelsewhere run-9\n")
    release_shard_lock(lock)
    assert lock.exists()
    take_shard_lock(lock, "run-9")  # this flow run's: taken over
    release_shard_lock(lock)
    assert not lock.exists()


class FullDiskRunner(PlainRunner):
    """Its writer goes to /dev/full: every flush fails with ENOSPC, naming no file."""

    @staticmethod
    def open_writers(shard_dir, **env):
        return {"out": open("/dev/full", "w")}  # noqa: SIM115 - closed by close_writers


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_full_disk_fails_the_shard_in_one_line_naming_where_leaving_no_lock_nor_marker(tmp_path, on_error):
    from espnet3_prefect.errors import DiskFullError

    layout = StageLayout(tmp_path / "t")
    with pytest.raises(DiskFullError) as caught:
        process_shard(FullDiskRunner, Shard("t", 0, 0, 7), _env(layout.output_dir), layout, on_error=on_error)
    message = str(caught.value)
    assert message.startswith(f"no space left on device writing {layout.shard_dir(0)} (")
    assert message.endswith("MB free on that filesystem); free space and re-run: shards done so far are kept")
    assert "\n" not in message and not is_retryable(caught.value)
    assert pickle.loads(pickle.dumps(caught.value)).message == message  # as Dask ships it
    assert sorted(os.listdir(layout.shard_dir(0))) == []  # no lock, no done


def test_enospc_and_edquot_are_not_retried():
    import errno

    assert not is_retryable(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_retryable(OSError(errno.EDQUOT, "Disk quota exceeded"))
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert not is_retryable(wrapped)
    assert is_retryable(OSError(errno.EIO, "Input/output error"))
