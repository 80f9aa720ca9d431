"""The job watcher polls the scheduler with back-off (2, 4, 8 ... s, capped at 60 s) and comes back
fast whenever something changed; it still reports jobs that end and fails a run with no worker."""

from __future__ import annotations

import threading

from espnet3_prefect.execution import backends
from espnet3_prefect.execution.backends.jobs import JobQueue, QueuedJob
from espnet3_prefect.execution.backends.watcher import FIRST_POLL_S, MAX_POLL_S, Backoff, JobWatcher


def test_backoff_doubles_up_to_the_cap_and_starts_over_after_a_change():
    backoff = Backoff()
    quiet = [backoff.next(changed=False) for _ in range(8)]
    assert quiet == [2, 4, 8, 16, 32, 60, 60, 60] and (FIRST_POLL_S, MAX_POLL_S) == (2, 60)
    assert [backoff.next(changed=True), backoff.next(changed=False), backoff.next(changed=True)] == [2, 4, 2]
    assert sum([2, 4, 8, 16, 32] + [60] * 59) < 3660  # a quiet hour: 64 polls, not 1,800


class FakeQueue(JobQueue):
    list_command = "true"
    ended_states = ("COMPLETED",)

    def __init__(self):
        self.listed: list[QueuedJob] = []
        self.calls = 0

    def available(self) -> bool:
        return True

    def jobs(self) -> list[QueuedJob]:
        self.calls += 1
        return list(self.listed)


class Cluster:
    def __init__(self):
        self.workers: dict = {}
        self.scheduler_info = {"workers": {}}


class Log:
    def __init__(self):
        self.lines = []

    def __getattr__(self, level):
        return lambda msg, *args: self.lines.append((level, msg % args))


class Backend:
    name = "fake"

    def __init__(self, queue):
        self.queue = queue


def watcher_for(queue, cluster, log, tmp_path, **kwargs):
    return JobWatcher(
        Backend(queue), "e3p-0123456789", tmp_path, cluster, log, expected_jobs=1, abort=lambda: None, **kwargs
    )


def test_a_poll_says_whether_anything_changed(tmp_path):
    queue, cluster, log = FakeQueue(), Cluster(), Log()
    watcher = watcher_for(queue, cluster, log, tmp_path)
    queue.listed = [QueuedJob("7", "e3p-0123456789", "PENDING"), QueuedJob("9", "other-run", "RUNNING")]
    assert watcher.poll() is True  # first look
    assert watcher.poll() is False  # nothing new: back off
    queue.listed = [QueuedJob("7", "e3p-0123456789", "RUNNING")]
    assert watcher.poll() is True  # our job changed state
    assert watcher.poll() is False
    cluster.scheduler_info = {"workers": {"tcp://w": {}}}
    assert watcher.poll() is True and watcher.first_worker_s is not None  # a worker connected
    assert watcher.poll() is False
    queue.listed = [QueuedJob("7", "e3p-0123456789", "COMPLETED")]
    assert watcher.poll() is True and watcher.ended == ["7"]  # our job ended: reported
    assert any("worker job 7 (e3p-0123456789) left the queue" in m for level, m in log.lines if level == "warning")


class RecordingBackoff(Backoff):
    """Hands out tiny waits but records the real schedule; stops the watcher after ``limit`` polls."""

    def __init__(self, stop: threading.Event, limit: int):
        super().__init__()
        self.schedule, self.stop, self.limit = [], stop, limit

    def next(self, changed: bool) -> float:
        self.schedule.append(super().next(changed))
        if len(self.schedule) > self.limit:
            self.stop.set()
        return 0.001


def test_the_watcher_waits_longer_while_nothing_changes_and_resets_on_a_change(tmp_path):
    queue, cluster, log = FakeQueue(), Cluster(), Log()
    queue.listed = [QueuedJob("7", "e3p-0123456789", "PENDING")]
    cluster.scheduler_info = {"workers": {"tcp://w": {}}}  # a worker: no "no worker" warnings
    watcher = watcher_for(queue, cluster, log, tmp_path)
    watcher.backoff = RecordingBackoff(watcher._halt, limit=9)
    original = watcher.poll

    def poll():
        if queue.calls == 4:  # the job starts running between the 4th and 5th look
            queue.listed = [QueuedJob("7", "e3p-0123456789", "RUNNING")]
        return original()

    watcher.poll = poll
    watcher.start()
    watcher.join(timeout=10)
    assert not watcher.is_alive()
    assert watcher.backoff.schedule[:9] == [2, 2, 4, 8, 16, 2, 4, 8, 16]
    assert watcher.error is None


def test_the_registry_gives_the_queue_commands_where_we_can_ask():
    assert backends.get("slurm").queue.list_command == "squeue"
    assert backends.get("sge").queue.list_command == "qstat"
    assert backends.get("oar").queue.list_command == "oarstat"
    assert all(b.queue is None for b in backends.batch() if b.name not in ("slurm", "sge", "oar"))
