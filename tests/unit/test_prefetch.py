"""Prefetch in the shard loop: forward gets the same values, in the same order, with the same errors,
whether the next batches are read ahead in a background thread or not (in-process, no Dask)."""

from __future__ import annotations

import threading
import time

import pytest

from espnet3_prefect import ConfigError, InferenceRunner, ItemError
from espnet3_prefect.config.runner_keys import check_prefetch
from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.disk.marker import read_marker
from espnet3_prefect.pipeline.plan import plan_shards
from espnet3_prefect.pipeline.prefetch import Timing, make_view
from espnet3_prefect.pipeline.shard import drive, process_shard


class Recordings:
    """A dataset class as recipes write them: items made on each read, reads logged with their thread."""

    def __init__(self, n: int, fail: dict | None = None, delay_s: float = 0.0):
        self.n, self.fail, self.delay_s = n, dict(fail or {}), delay_s
        self.reads: list[tuple[int, str]] = []
        self._inside = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx):
        self._inside += 1
        try:
            if self._inside > 1:
                raise AssertionError("dataset read from two threads at once")
            self.reads.append((idx, threading.current_thread().name))
            if self.delay_s:
                time.sleep(self.delay_s)
            how = self.fail.get(idx)
            if how == "always" or (how == "thread" and threading.current_thread().name == "e3p-prefetch"):
                raise OSError(f"cannot decode recording {idx}")
            return {"utt_id": f"spk1_{idx:03d}", "x": idx, "payload": [idx] * 3}
        finally:
            self._inside -= 1


class Seen:
    """What forward was given: the dataset's type, and each value it read, in order."""

    calls: list = []


class RecordingRunner(InferenceRunner):
    @classmethod
    def forward(cls, idx, dataset=None, model=None, **kwargs):
        Seen.calls.append((idx, type(dataset).__name__, isinstance(dataset, Recordings), dataset.n))
        return super().forward(idx, dataset=dataset, model=model, **kwargs)


def _model(x):
    return {"y": [v * 7 for v in x] if isinstance(x, list) else x * 7}


def _output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [{"utt_id": d["utt_id"], "y": y} for d, y in zip(data, model_output["y"])]
    return {"utt_id": data["utt_id"], "y": model_output["y"]}


def _env(tmp_path, dataset, **extra):
    return {
        "dataset": dataset,
        "model": _model,
        "input_key": "x",
        "output_fn": _output_fn,
        "idx_key": "utt_id",
        "output_keys": None,
        "hyp_key": [],
        "ref_key": [],
        "output_dir": str(tmp_path),
        **extra,
    }


def _units(n, batch_size):
    return list(plan_shards("t", n, 1, batch_size)[0].units())


@pytest.mark.parametrize("batch_size", [None, 3])
def test_same_output_order_and_forward_arguments_with_prefetch_on_and_off(tmp_path, batch_size):
    outputs, calls = {}, {}
    for depth in (0, 1, 4):
        Seen.calls = []
        dataset = Recordings(11)
        out = tmp_path / f"d{depth}"
        assert drive(RecordingRunner, _units(11, batch_size), _env(out, dataset), 0, prefetch=depth) == []
        outputs[depth] = (out / "split.0/y.scp").read_bytes()
        calls[depth] = Seen.calls
        assert [i for i, _ in dataset.reads] == list(range(11))  # each item read once, in order
        threads = {t for _, t in dataset.reads}
        assert threads == ({"MainThread"} if depth == 0 else {"e3p-prefetch"})
    assert outputs[0] == outputs[1] == outputs[4]
    assert outputs[0].decode().splitlines()[:2] == ["spk1_000 0", "spk1_001 7"]
    # forward sees the dataset's own class name, isinstance holds, attributes are the dataset's
    assert calls[0] == calls[1] == calls[4]
    assert calls[4][0][1:] == ("Recordings", True, 11)
    assert not [t for t in threading.enumerate() if t.name == "e3p-prefetch"]


def test_each_read_is_a_fresh_value_as_without_prefetch(tmp_path):
    """A second dataset[i] in the same call reads the dataset again: never the object handed out before."""
    got = []

    class TwiceRunner:
        @staticmethod
        def forward(idx, dataset, **env):
            first = dataset[idx]
            first["payload"].append("mutated")
            second = dataset[idx]
            got.append((first is second, second["payload"]))
            return idx

    dataset = Recordings(4)
    drive(TwiceRunner, [0, 1, 2, 3], _env(tmp_path, dataset), 0, prefetch=2)
    assert got == [(False, [i] * 3) for i in range(4)]
    assert sorted(i for i, _ in dataset.reads) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_read_that_fails_names_the_utterance_and_the_error(tmp_path):
    dataset = Recordings(8, fail={5: "always"})
    with pytest.raises(ItemError, match=r"^item 5: OSError: cannot decode recording 5$") as err:
        drive(RecordingRunner, _units(8, None), _env(tmp_path, dataset), 0, prefetch=2)
    assert isinstance(err.value.__cause__, OSError)
    batched = Recordings(8, fail={5: "always"})
    with pytest.raises(ItemError, match=r"^items 3..5: OSError: cannot decode recording 5$"):
        drive(RecordingRunner, _units(8, 3), _env(tmp_path / "b", batched), 0, prefetch=2)
    assert not [t for t in threading.enumerate() if t.name == "e3p-prefetch"]


def test_skip_lists_the_failing_item_and_keeps_the_rest_in_order(tmp_path):
    outputs = {}
    for depth in (0, 2):
        dataset = Recordings(9, fail={4: "always"})
        out = tmp_path / f"d{depth}"
        failures = drive(RecordingRunner, _units(9, 2), _env(out, dataset), 0, on_error="skip", prefetch=depth)
        assert [f["idx"] for f in failures] == [4]
        assert failures[0]["error"] == "OSError: cannot decode recording 4"
        outputs[depth] = (out / "split.0/y.scp").read_text()
    assert outputs[0] == outputs[2]
    assert [line.split()[0] for line in outputs[2].splitlines()] == [f"spk1_{i:03d}" for i in range(9) if i != 4]


def test_a_read_failing_only_in_the_thread_turns_prefetch_off_and_changes_nothing(tmp_path):
    warnings = []
    dataset = Recordings(10, fail={3: "thread"})
    drive(RecordingRunner, _units(10, None), _env(tmp_path / "a", dataset), 0, prefetch=2, log=warnings.append)
    reference = Recordings(10)
    drive(RecordingRunner, _units(10, None), _env(tmp_path / "b", reference), 0, prefetch=0)
    assert (tmp_path / "a/split.0/y.scp").read_bytes() == (tmp_path / "b/split.0/y.scp").read_bytes()
    assert len(warnings) == 1 and "prefetch turned off for the rest of this shard" in warnings[0]
    assert "dataset[3] failed in the prefetch thread (OSError: cannot decode recording 3)" in warnings[0]
    later = [thread for i, thread in dataset.reads if i >= 7]  # the thread reads at most 3 units ahead of 3
    assert set(later) == {"MainThread"}  # read in place after the switch


def test_reads_cheaper_than_the_hand_over_go_back_in_place_quietly(tmp_path):
    """A forward that holds the GIL (busy Python) and reads that cost nothing: each read-ahead item
    waits for the interpreter to switch threads, so after WORTH_IT_AFTER_UNITS units the shard reads in
    place, without a warning; values and order are those of prefetch off."""
    import sys

    from espnet3_prefect.pipeline.prefetch import WORTH_IT_AFTER_UNITS

    class BusyRunner(RecordingRunner):
        @classmethod
        def forward(cls, idx, dataset=None, model=None, **kwargs):
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            return super().forward(idx, dataset=dataset, model=model, **kwargs)

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.05)  # the reader gets the GIL only when the loop blocks: every wait holds a read
    try:
        n, warnings = 3 * WORTH_IT_AFTER_UNITS, []
        dataset = Recordings(n)
        drive(BusyRunner, _units(n, None), _env(tmp_path / "a", dataset), 0, prefetch=1, log=warnings.append)
    finally:
        sys.setswitchinterval(before)
    drive(BusyRunner, _units(n, None), _env(tmp_path / "b", Recordings(n)), 0, prefetch=0)
    assert (tmp_path / "a/split.0/y.scp").read_bytes() == (tmp_path / "b/split.0/y.scp").read_bytes()
    assert warnings == []
    read_ahead = [i for i, thread in dataset.reads if thread == "e3p-prefetch"]
    in_place = [i for i, thread in dataset.reads if thread == "MainThread"]
    # the thread read the first units and at most two more (one queued, one in hand), dropped at the switch
    assert (
        read_ahead == list(range(len(read_ahead)))
        and WORTH_IT_AFTER_UNITS < len(read_ahead) <= WORTH_IT_AFTER_UNITS + 3
    )
    assert in_place == list(range(WORTH_IT_AFTER_UNITS + 1, n))


def test_reads_that_overlap_forward_stay_in_the_thread(tmp_path):
    """Slow reads (5 ms, off the GIL) beside a slower forward (10 ms): read ahead to the end."""

    class SleepyRunner(RecordingRunner):
        @classmethod
        def forward(cls, idx, dataset=None, model=None, **kwargs):
            time.sleep(0.01)
            return super().forward(idx, dataset=dataset, model=model, **kwargs)

    dataset = Recordings(30, delay_s=0.005)
    drive(SleepyRunner, _units(30, None), _env(tmp_path, dataset), 0, prefetch=2)
    assert [i for i, _ in dataset.reads] == list(range(30))
    assert {thread for _, thread in dataset.reads} == {"e3p-prefetch"}


def test_datasets_without_a_safe_view_are_passed_through(tmp_path):
    class Slotted:
        __slots__ = ("items",)

        def __init__(self):
            self.items = [{"utt_id": "a", "x": 1}, {"utt_id": "b", "x": 2}]

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return self.items[i]

    for dataset in ([{"utt_id": "a", "x": 1}, {"utt_id": "b", "x": 2}], Slotted()):
        assert make_view(dataset) is None
        timing = Timing()
        seen = []

        class Plain:
            @staticmethod
            def forward(idx, dataset, **env):
                seen.append(dataset)
                return idx

        drive(Plain, [0, 1], _env(tmp_path, dataset), 0, prefetch=2, timing=timing)
        assert seen == [dataset, dataset] and all(s is dataset for s in seen)
        assert timing.load_s is None and timing.prefetch == 0


def test_forward_without_a_dataset_argument_gets_no_view(tmp_path):
    seen = []

    class NoDataset:
        @staticmethod
        def forward(idx, model):
            seen.append(idx)
            return idx

    dataset = Recordings(3)
    timing = Timing()
    drive(NoDataset, [0, 1, 2], _env(tmp_path, dataset), 0, prefetch=2, timing=timing)
    assert seen == [0, 1, 2] and dataset.reads == [] and timing.prefetch == 0


def test_timing_splits_loading_forward_and_writing_and_lands_in_the_marker(tmp_path):
    layout = StageLayout(tmp_path / "test_a")
    dataset = Recordings(6, delay_s=0.02)
    [shard] = plan_shards("test_a", 6, 1, batch_size=2)
    summary = process_shard(RecordingRunner, shard, _env(layout.output_dir, dataset), layout, prefetch=2)
    timing = summary["timing"]
    assert set(timing) == {"load_s", "wait_s", "forward_s", "write_s", "prefetch"}
    assert timing["prefetch"] == 2 and timing["load_s"] >= 6 * 0.02 * 0.9
    assert timing["forward_s"] >= 0 and timing["write_s"] > 0
    assert timing["wait_s"] <= summary["seconds"]
    marker = read_marker(layout.shard_dir(0))
    assert marker["timing"]["load_s"] == timing["load_s"]
    off = process_shard(RecordingRunner, shard, _env(layout.output_dir, Recordings(6)), layout, prefetch=0)
    assert off["timing"]["load_s"] is None and off["timing"]["prefetch"] == 0


def test_prefetch_setting():
    assert check_prefetch(0) == 0 and check_prefetch(3) == 3 and check_prefetch(False) == 0
    for bad in (-1, "2", 1.5, [2]):
        with pytest.raises(ConfigError, match=r"^runner.prefetch: must be an integer >= 0"):
            check_prefetch(bad)
