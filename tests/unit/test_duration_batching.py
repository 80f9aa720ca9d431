"""Batches by duration (``runner.max_duration``): the batch cutter, the key's checks, the in-order
hand-over to the hooks, the padding measured per shard, and nothing changed without the key."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from espnet3_prefect import ConfigError
from espnet3_prefect.config.load import load_config
from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.pipeline.duration import InOrder, check_max_duration, duration_batches, padding
from espnet3_prefect.pipeline.plan import Shard, plan_shards, shard_cost
from espnet3_prefect.pipeline.resume import plan_for
from espnet3_prefect.pipeline.shard import drive, process_shard
from espnet3_prefect.pipeline.sizing import require_lengths, size_on_driver
from espnet3_prefect.pipeline.stage import build_stages
from tests.conftest import toy_config, write_yaml

# -- the batch cutter ----------------------------------------------------------------------------


def _check_batches(indices, lengths, budget, cap, batches):
    length_of = dict(zip(indices, lengths))
    flat = [i for b in batches for i in b]
    assert sorted(flat) == sorted(indices) and len(flat) == len(set(flat))  # every index exactly once
    for batch in batches:
        assert 1 <= len(batch) <= cap
        longest = max(length_of[i] for i in batch)
        assert longest * len(batch) <= budget or len(batch) == 1  # only a lone item may exceed it
    keys = [(-length_of[i], i) for i in flat]
    assert keys == sorted(keys)  # longest first, ties by index


@pytest.mark.parametrize("seed", range(20))
def test_batches_respect_budget_and_cap_cover_every_index_once_and_are_deterministic(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 200)
    start = rng.randint(0, 1000)
    indices = list(range(start, start + n))
    lengths = [round(rng.uniform(0.2, 20.0), 3) for _ in indices]
    budget, cap = rng.choice([5.0, 30.0, 100.0]), rng.choice([1, 3, 8, 64])
    batches = duration_batches(indices, lengths, budget, cap)
    _check_batches(indices, lengths, budget, cap, batches)
    assert duration_batches(indices, list(lengths), budget, cap) == batches


def test_an_item_longer_than_the_budget_is_a_batch_of_its_own_and_the_count_is_capped():
    assert duration_batches([0, 1, 2, 3], [2.0, 50.0, 2.0, 2.0], 10.0, 8) == [[1], [0, 2, 3]]
    assert duration_batches(range(6), [1.0] * 6, 100.0, 4) == [[0, 1, 2, 3], [4, 5]]
    assert duration_batches(range(3), [3.0, 3.0, 3.0], 6.0, 8) == [[0, 1], [2]]  # 3 x 2 = 6 fits exactly
    assert duration_batches(range(3), [0.0, 0.0, 0.0], 1.0, 2) == [[0, 1], [2]]  # zero lengths: the cap decides


def test_padding_sums_real_and_padded_length():
    assert padding([[0, 1], [2]], {0: 1.0, 1: 3.0, 2: 2.0}) == {"batches": 2, "real": 6.0, "padded": 8.0}
    assert padding([0, 1], {0: 1.0, 1: 3.0}) == {"batches": 2, "real": 4.0, "padded": 4.0}  # batch_size null


# -- the key --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "30", True, float("nan"), float("inf"), [30]])
def test_a_bad_max_duration_fails_on_one_line_naming_the_key_and_its_unit(bad):
    with pytest.raises(ConfigError) as caught:
        check_max_duration(bad, 8)
    message = str(caught.value)
    assert message.startswith("runner.max_duration: ") and "\n" not in message
    if not isinstance(bad, float):
        assert "lengths()" in message  # says what unit the budget is in


def test_max_duration_needs_a_batch_size():
    with pytest.raises(ConfigError, match=r"^runner.max_duration: needs batch_size .* batch_size is null"):
        check_max_duration(30, None)
    assert check_max_duration(None, None) is None and check_max_duration(2, 1) == 2.0


def _stages(tmp_path, *overrides, lengths=(1.0,) * 10, batch_size=4):
    cfg = toy_config(tmp_path, n=10 if lengths is None else len(lengths), num_shards=3, batch_size=batch_size)
    if lengths is not None:
        cfg["dataset"]["test"][0]["lengths"] = list(lengths)
    return build_stages(load_config([write_yaml(tmp_path / "c.yaml", cfg)], list(overrides)))[1]


def test_the_key_is_checked_with_the_config_joins_the_fingerprint_and_never_reaches_the_runner(tmp_path):
    [plain] = _stages(tmp_path)
    [keyed] = _stages(tmp_path, "+runner.max_duration=6")
    assert plain.work.max_duration is None and keyed.work.max_duration == 6.0
    assert keyed.work.fingerprint != plain.work.fingerprint  # turning it on or off redoes every shard
    assert _stages(tmp_path, "+runner.max_duration=8")[0].work.fingerprint != keyed.work.fingerprint
    assert not hasattr(keyed.runner, "max_duration")
    with pytest.raises(ConfigError, match=r"^runner.max_duration: must be a number > 0"):
        _stages(tmp_path, "+runner.max_duration=0")
    with pytest.raises(ConfigError, match=r"^runner.max_duration: needs batch_size"):
        _stages(tmp_path, "+runner.max_duration=6", batch_size=None)


def test_a_dataset_without_lengths_refuses_the_key_on_one_line(tmp_path):
    [stage] = _stages(tmp_path, "+runner.max_duration=6", lengths=None)
    expected = r"^runner.max_duration: test set 'test_a': its dataset \(ToyDataset\) has no lengths\(\)"
    with pytest.raises(ConfigError, match=expected):
        size_on_driver(stage)
    from espnet3_prefect.pipeline.sizing import checked_dataset

    with pytest.raises(ConfigError, match=expected):
        require_lengths(stage, checked_dataset(stage))
    with pytest.raises(ConfigError, match=r"^runner.max_duration: test set 'test_a': its provider"):
        plan_for(stage, 10)  # a provider without build_dataset(): no lengths to plan on


def test_with_a_runner_of_its_own_merge_shards_are_the_same_ranges_and_batches_follow_the_budget(tmp_path):
    lengths = [1.0, 4.0, 2.0, 2.0, 9.0, 1.0, 3.0, 3.0, 0.5, 6.0]
    own = "runner._target_=tests.helpers.toy.OwnMergeRunner"
    [plain] = _stages(tmp_path, own, lengths=lengths)
    [keyed] = _stages(tmp_path, own, "+runner.max_duration=6", lengths=lengths)
    assert not keyed.work.length_order and "order" not in keyed.work.identity
    sizing = size_on_driver(keyed)
    before, after = plan_for(plain, 10, sizing.lengths), plan_for(keyed, 10, sizing.lengths)
    assert [(s.start, s.stop) for s in after] == [(s.start, s.stop) for s in before]
    assert [list(s.units()) for s in after] == [list(s.units()) for s in before]  # the manifest's batches
    for shard in after:
        own = shard.item_lengths()
        indices = list(range(shard.start, shard.stop))
        _check_batches(indices, own, 6.0, 4, shard.forward_units())


def test_with_an_scp_runner_the_whole_test_set_is_sorted_and_the_shards_are_runs_of_its_batches(tmp_path):
    rng = random.Random(3)
    lengths = [round(rng.uniform(0.2, 12.0), 2) for _ in range(41)]
    [keyed] = _stages(tmp_path, "+runner.max_duration=16", lengths=lengths)
    assert keyed.work.length_order and keyed.work.identity["order"] == "length, whole test set"
    [plain_order] = _stages(tmp_path, "runner._target_=tests.helpers.toy.OwnMergeRunner", "+runner.max_duration=16",
                            lengths=lengths)  # fmt: skip
    assert plain_order.work.fingerprint != keyed.work.fingerprint  # another plan: shards are never mixed
    sizing = size_on_driver(keyed)
    shards = plan_for(keyed, len(lengths), sizing.lengths)
    whole = duration_batches(range(len(lengths)), lengths, 16.0, 4)
    assert len(shards) == 3 and [u for s in shards for u in s.forward_units()] == whole
    assert [list(s.units()) for s in shards] == [s.forward_units() for s in shards]  # handed over as they run
    _check_batches(list(range(len(lengths))), lengths, 16.0, 4, whole)
    position = 0
    for shard in shards:  # start/stop: positions in the sorted order, the items in that order
        assert shard.length_order and (shard.start, shard.stop) == (position, position + len(shard.indices))
        assert shard.item_lengths() == [lengths[i] for i in shard.indices]
        position = shard.stop
    assert position == len(lengths)
    costs = [shard_cost(s) for s in shards]
    assert max(costs) < 1.5 * sum(costs) / len(costs)  # balanced on padded length
    assert plan_for(keyed, len(lengths), sizing.lengths) == shards  # the same lengths, the same plan
    length_of = dict(enumerate(lengths))
    whole_padding = padding(whole, length_of)
    per_shard = [padding(s.forward_units(), length_of) for s in shards]
    assert sum(p["padded"] for p in per_shard) == pytest.approx(whole_padding["padded"])


def test_without_the_key_the_units_are_exactly_todays(tmp_path):
    lengths = [float(i % 7) for i in range(37)]
    for batch_size in (None, 1, 4):
        for shard in plan_shards("t", 37, 5, batch_size, lengths=lengths):
            assert shard.max_duration is None
            assert shard.forward_units() == list(shard.units())
            expected = list(range(shard.start, shard.stop))
            if batch_size is not None:
                expected = [expected[k : k + batch_size] for k in range(0, len(expected), batch_size)]
            assert shard.forward_units() == expected
    [stage] = _stages(tmp_path, lengths=lengths, batch_size=4)
    assert [list(s.units()) for s in plan_for(stage, 37)] == [list(s.units()) for s in plan_shards("test_a", 37, 3, 4)]


# -- the hand-over in dataset order ---------------------------------------------------------------

DATA = [{"utt_id": f"u{i}", "x": i} for i in range(12)]
LENGTHS = [3.0, 1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 4.0, 1.0, 6.0, 2.0, 3.0]


class LinesRunner:
    """Writes one line per item; records each forward call and what each write_record call got."""

    calls: list = []
    writes: list = []

    @staticmethod
    def forward(idx, dataset, model, **env):
        LinesRunner.calls.append(list(idx) if isinstance(idx, list) else idx)
        items = idx if isinstance(idx, list) else [idx]
        return [{"utt_id": dataset[i]["utt_id"], "y": model(dataset[i]["x"])} for i in items]

    @staticmethod
    def open_writers(shard_dir, **env):
        return {"out": (shard_dir / "y.txt").open("w")}

    @staticmethod
    def write_record(writers, result, state, **env):
        LinesRunner.writes.append([r["utt_id"] for r in result])
        for r in result:
            writers["out"].write(f"{r['utt_id']} {r['y']}\n")

    @staticmethod
    def close_writers(writers, state, **env):
        writers["out"].close()


def _model(x):
    if x == 7:
        raise RuntimeError("bad item")
    return x * 10


def _run(tmp_path, shard, on_error="fail"):
    LinesRunner.calls, LinesRunner.writes = [], []
    layout = StageLayout(tmp_path)
    env = {"dataset": DATA, "model": _model if on_error == "skip" else (lambda x: x * 10), "output_dir": str(tmp_path)}
    summary = process_shard(LinesRunner, shard, env, layout, on_error=on_error, prefetch=0)
    return summary, (layout.shard_dir(shard.index) / "y.txt").read_text()


def _shard(max_duration=None, index=0):
    [shard] = plan_shards("t", 12, 1, 4, lengths=LENGTHS, max_duration=max_duration)
    return Shard(shard.test_set, index, shard.start, shard.stop, 4, None, shard.lengths, max_duration)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_results_reach_write_record_in_dataset_order_grouped_as_without_the_key(tmp_path, on_error):
    plain, plain_text = _run(tmp_path / "plain", _shard(), on_error)
    plain_calls, plain_writes = LinesRunner.calls, LinesRunner.writes
    keyed, keyed_text = _run(tmp_path / "keyed", _shard(8.0), on_error)
    assert keyed_text == plain_text  # the same lines in the same order
    assert LinesRunner.writes == plain_writes  # grouped as upstream's batches (item by item around a skip)
    assert plain_calls[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # upstream's consecutive batches
    batches = [c for c in LinesRunner.calls if isinstance(c, list)]
    assert batches[0] == [5]  # longest first; 8 x 1 within 8
    for batch in batches:
        assert max(LENGTHS[i] for i in batch) * len(batch) <= 8.0 and len(batch) <= 4
    assert keyed["failed"] == plain["failed"] == (1 if on_error == "skip" else 0)
    # padding: upstream's batches [0..3] [4..7] [8..11]: longest 5, 8, 6 -> padded 76 of 38 real
    assert plain["padding"] == {"batches": 3, "real": 38.0, "padded": 76.0}
    assert keyed["padding"]["real"] == 38.0 and keyed["padding"]["padded"] < 76.0
    assert "lengths" not in keyed and keyed["max_duration"] == 8.0


def test_a_shard_without_lengths_has_no_padding_in_its_summary(tmp_path):
    summary, _ = _run(tmp_path, Shard("t", 0, 0, 12, 4))
    assert "padding" not in summary


def test_a_forward_without_one_result_per_item_is_refused_naming_the_runner(tmp_path):
    class WholeBatch(LinesRunner):
        @staticmethod
        def forward(idx, dataset, model, **env):
            return {"utt_id": [dataset[i]["utt_id"] for i in idx]}

    layout = StageLayout(tmp_path)
    env = {"dataset": DATA, "model": lambda x: x, "output_dir": str(tmp_path)}
    expected = r"^runner.max_duration: .*WholeBatch.forward returned dict for a batch of \d+ items"
    with pytest.raises(ConfigError, match=expected):
        process_shard(WholeBatch, _shard(8.0), env, layout, prefetch=0)
    assert not (layout.shard_dir(0) / "done").exists()


def test_in_order_hands_on_a_group_as_soon_as_it_is_complete():
    order = InOrder([[0, 1], [2, 3], [4]], "R")
    order.add([3, 4], ["r3", "r4"])
    assert list(order.ready()) == []
    order.add([0, 1], ["r0", "r1"])
    assert list(order.ready()) == [["r0", "r1"]]
    order.fail(2)
    assert list(order.ready()) == [["r3"], ["r4"]] and order.finished


def test_drive_without_hand_over_is_unchanged(tmp_path):
    LinesRunner.calls, LinesRunner.writes = [], []
    env = {"dataset": DATA, "model": lambda x: x, "output_dir": str(tmp_path)}
    assert drive(LinesRunner, [[2, 0], [1]], env, 0, prefetch=0) == []
    assert LinesRunner.writes == [["u2", "u0"], ["u1"]]  # as given: no reordering without the key


def test_padding_is_summed_with_the_timing():
    from espnet3_prefect.pipeline.report import add_timing, empty_timing

    total = empty_timing()
    for real, padded in ((6.0, 8.0), (2.0, 2.5)):
        add_timing(total, {"seconds": 1.0, "timing": {}, "padding": {"batches": 2, "real": real, "padded": padded}})
    assert total["padding"] == {"batches": 4, "real": 8.0, "padded": 10.5}
    assert "padding" not in add_timing(empty_timing(), {"seconds": 1.0, "timing": {}})
    assert np.isclose(total["padding"]["real"] / total["padding"]["padded"], 8.0 / 10.5)


# -- the whole test set in length order: written as it runs, merged back in dataset order ---------


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_length_order_shard_writes_each_batch_as_it_runs_and_its_marker_says_whose_lines_they_are(tmp_path, on_error):
    from espnet3_prefect.disk.marker import read_marker
    from espnet3_prefect.pipeline.plan import plan_length_order

    shards = plan_length_order("t", LENGTHS, 2, 4, 8.0)
    layout = StageLayout(tmp_path)
    model = _model if on_error == "skip" else (lambda x: x * 10)  # item 7 fails under skip
    for shard in shards:
        LinesRunner.calls, LinesRunner.writes = [], []
        env = {"dataset": DATA, "model": model, "output_dir": str(tmp_path)}
        summary = process_shard(LinesRunner, shard, env, layout, on_error=on_error, prefetch=0)
        kept = [[i for i in batch if not (on_error == "skip" and i == 7)] for batch in shard.forward_units()]
        if on_error == "fail":  # each batch's results go to write_record as one call, in the order they ran
            assert LinesRunner.writes == [[f"u{i}" for i in batch] for batch in kept]
        written = [u for w in LinesRunner.writes for u in w]
        assert written == [f"u{i}" for batch in kept for i in batch]
        keys = read_marker(layout.shard_dir(shard.index))["keys"]
        assert keys == [[i, f"u{i}"] for batch in kept for i in batch]  # in the order its lines were written
        lines = (layout.shard_dir(shard.index) / "y.txt").read_text().split()[::2]
        assert lines == written
        assert summary["padding"]["padded"] == padding(shard.forward_units(), dict(enumerate(LENGTHS)))["padded"]


def _merged_scp(tmp_path, text: str, keys: list) -> Path:
    from espnet3_prefect.disk.marker import write_marker

    shard_dir = tmp_path / "split.0"
    shard_dir.mkdir(parents=True)
    write_marker(shard_dir, {"keys": keys})
    (tmp_path / "y.scp").write_bytes(text.encode())
    return tmp_path / "y.scp"


def test_the_merge_puts_each_merged_scp_back_in_dataset_order_keeping_every_byte(tmp_path):
    from espnet3_prefect.pipeline.merge import put_in_dataset_order

    path = _merged_scp(tmp_path, "b two  words\na \u00e9t\u00e9\r\nc 3", [[1, "b"], [0, "a"], [2, "c"]])
    (tmp_path / "notes.txt").write_text("b\na\n")
    assert put_in_dataset_order([path, tmp_path / "notes.txt"], [tmp_path / "split.0"], "test set 't'") == 1
    assert path.read_bytes() == "a \u00e9t\u00e9\r\nb two  words\nc 3".encode()  # no newline added at the end
    assert (tmp_path / "notes.txt").read_text() == "b\na\n"  # not an SCP: left as written


def test_a_merged_line_of_an_unknown_or_shared_utt_id_fails_on_one_line_and_the_file_is_untouched(tmp_path):
    from espnet3_prefect import Espnet3PrefectError
    from espnet3_prefect.pipeline.merge import put_in_dataset_order

    path = _merged_scp(tmp_path / "unknown", "b 2\nz 9\n", [[1, "b"]])
    with pytest.raises(Espnet3PrefectError, match=r"^test set 't': .*y.scp line 2: 'z' is not the utt_id of an"):
        put_in_dataset_order([path], [path.parent / "split.0"], "test set 't'")
    assert path.read_text() == "b 2\nz 9\n"
    path = _merged_scp(tmp_path / "shared", "a 1\na 2\n", [[4, "a"], [1, "a"]])
    with pytest.raises(Espnet3PrefectError, match=r"^test set 't': utt_id 'a' is the id of items 4 and 1; "):
        put_in_dataset_order([path], [path.parent / "split.0"], "test set 't'")


def test_only_a_runner_that_writes_and_merges_as_inference_runner_sorts_the_whole_test_set():
    from espnet3_prefect import InferenceRunner
    from espnet3_prefect.pipeline.duration import sorts_whole_test_set
    from tests.helpers.toy import BatchLogRunner, OwnMergeRunner

    class OwnWrites(InferenceRunner):
        @staticmethod
        def write_record(writers, result, state, **env):
            return None

    assert sorts_whole_test_set(InferenceRunner) and sorts_whole_test_set(BatchLogRunner)
    assert not sorts_whole_test_set(OwnMergeRunner) and not sorts_whole_test_set(OwnWrites)
    assert not sorts_whole_test_set(LinesRunner)


def test_espnet3s_own_runners_sort_the_whole_test_set():
    """ESPnet3 202611's ASR runner keeps the base InferenceRunner's writers and merge (runs in the
    real-ESPnet layer; the recipe-level check is tests/realespnet/test_mini_an4.py)."""
    asr = pytest.importorskip("espnet3.systems.esp2_asr.inference", reason="espnet3 is not importable here")
    from espnet3_prefect.pipeline.duration import sorts_whole_test_set

    assert sorts_whole_test_set(asr.ASRInferenceRunner)
