"""set_parallel / get_parallel_config semantics, the run-runner job (plan, fingerprint, what the API
stores), and the feature/statistics demo in-process (no Prefect, no Dask)."""

from __future__ import annotations

import json
import pickle
import sys
import types

import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf

from dtmf_demo.dtmf import make_corpus
from dtmf_demo.feats import FeatsProvider, FeatsRunner, LogMel, write_npz
from espnet3_prefect import BadInputError, ConfigError, entry, get_parallel_config, set_parallel
from espnet3_prefect.execution import process_parallel as parallel_config
from espnet3_prefect.pipeline.runner_job import check_indices, prepare_job, runner_fingerprint
from tests.helpers.workloads import LengthsProvider, LogProvider, SquareRunner, batches


@pytest.fixture(autouse=True)
def fresh():
    parallel_config._reset()
    yield
    parallel_config._reset()


def test_set_parallel_none_registers_the_default_once_and_then_keeps_what_is_there():
    assert get_parallel_config() is None
    set_parallel(None)
    cfg = get_parallel_config()
    assert isinstance(cfg, DictConfig) and OmegaConf.to_container(cfg) == {
        "env": "local",
        "n_workers": 1,
        "options": {},
    }
    set_parallel(OmegaConf.create({"env": "local", "n_workers": 3}))
    set_parallel(None)  # keeps the registered block
    assert get_parallel_config().n_workers == 3


def test_set_parallel_takes_dictconfig_or_dict_resolves_and_validates():
    cfg = OmegaConf.create({"workers": 4, "parallel": {"env": "local", "n_workers": "${workers}"}})
    set_parallel(cfg.parallel)
    assert get_parallel_config().n_workers == 4 and dict(get_parallel_config().options) == {}
    set_parallel({"env": "local", "n_workers": 2, "options": {"threads_per_worker": 1}})
    assert get_parallel_config().options.threads_per_worker == 1
    for bad, message in [
        ({"env": "slrum"}, "parallel.env: unknown backend 'slrum'"),
        ({"env": "local", "n_workers": 0}, "parallel.n_workers: must be a positive integer"),
        ({"env": "local", "options": {"queue": "x"}}, "parallel.options.queue: a batch-scheduler"),
        ({"env": "local", "nworkers": 2}, "parallel.nworkers: unknown key"),
        ("local", "parallel: must be a mapping"),
    ]:
        with pytest.raises(ConfigError, match=message):
            set_parallel(bad)
    assert get_parallel_config().n_workers == 2  # a refused block leaves the registered one alone


def test_a_block_registered_with_upstreams_set_parallel_is_seen_by_our_runners(monkeypatch):
    fake = types.ModuleType("espnet3.parallel.parallel")
    fake.parallel_config = OmegaConf.create({"env": "local", "n_workers": 2, "options": {}})
    monkeypatch.setitem(sys.modules, "espnet3.parallel.parallel", fake)
    assert parallel_config.active_parallel_config().n_workers == 2
    set_parallel({"env": "local", "n_workers": 5})
    assert parallel_config.active_parallel_config().n_workers == 5  # ours first


def test_without_a_block_runner_call_stays_in_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(entry, "run", lambda *a, **k: pytest.fail("no flow without a parallel block"))
    runner = SquareRunner(LogProvider({}), None, tmp_path / "out")
    assert runner([4, 1]) == ["4 16", "1 1"]


def test_job_plans_explicit_lists_per_shard_and_a_range_as_plain_ranges(tmp_path):
    runner = SquareRunner(LogProvider({}), 2, tmp_path)
    job = prepare_job(runner, [8, 1, 1, 3, 9], {"env": "local", "n_workers": 2, "num_shards": 2})
    assert [(s.start, s.stop, s.indices) for s in job.shards] == [(0, 4, (8, 1, 1, 3)), (4, 5, (9,))]
    assert [list(s.units()) for s in job.shards] == [[[8, 1], [1, 3]], [[9]]]
    job = prepare_job(runner, range(70), None)
    assert len(job.shards) == 32 and all(s.indices is None for s in job.shards)  # default plan, as infer's
    assert job.stage.work.test_set == "SquareRunner" and job.stage.layout.run_lock_dir == tmp_path


LENGTHS = [3.0, 1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 4.0, 1.0, 6.0, 2.0, 3.0]


def test_runner_indices_with_max_duration_cut_batches_by_length_and_keep_the_lists_order(tmp_path):
    """``runner(indices)`` in this process with the runner's ``max_duration``: the provider's dataset
    (built on the driver) tells the lengths; each shard's batches are cut by length; the merge is the
    one of a run without it, line for line."""
    from espnet3_prefect.pipeline.duration import duration_batches

    order = [11, 2, 9, 0, 5, 7, 3, 10, 1, 4]
    log = tmp_path / "log"
    provider = LengthsProvider({"log": str(log), "lengths": LENGTHS})
    plain = SquareRunner(provider, 4, tmp_path / "plain")(order)
    assert batches(log) == [order[:4], order[4:8], order[8:]]  # upstream's consecutive batches
    keyed_runner = SquareRunner(provider, 4, tmp_path / "keyed")
    keyed_runner.max_duration = 8.0
    job = prepare_job(keyed_runner, order, None)
    assert job.stage.work.max_duration == 8.0 and job.summary["max_duration"] == 8.0
    assert keyed_runner(order) == plain
    assert (tmp_path / "keyed/out.txt").read_bytes() == (tmp_path / "plain/out.txt").read_bytes()
    expected = [b for s in job.shards for b in duration_batches(s.indices, [LENGTHS[i] for i in s.indices], 8.0, 4)]
    assert batches(log)[3:] == expected
    assert sorted(i for b in expected for i in b) == sorted(order)
    plain_job = prepare_job(SquareRunner(provider, 4, tmp_path / "keyed"), order, None)
    assert plain_job.stage.work.fingerprint != job.stage.work.fingerprint  # toggling it redoes the shards


def test_runner_indices_with_max_duration_refuse_what_they_cannot_do_on_one_line(tmp_path):
    keyed = {"env": "local", "n_workers": 1}
    no_dataset = SquareRunner(LogProvider({}), 4, tmp_path / "a")
    with pytest.raises(
        ConfigError, match=r"^max_duration: SquareRunner\(indices\): its provider \(LogProvider\) has no"
    ):
        prepare_job(no_dataset, [0, 1], keyed, {"max_duration": 8.0})
    runner = SquareRunner(LengthsProvider({"lengths": LENGTHS}), 4, tmp_path / "b")
    with pytest.raises(BadInputError, match=r"^max_duration: SquareRunner\(indices\): index 3 is listed twice"):
        prepare_job(runner, [3, 1, 3], keyed, {"max_duration": 8.0})
    with pytest.raises(BadInputError, match=r"index 12 is outside its provider's dataset \(12 items\)"):
        prepare_job(runner, [0, 12], keyed, {"max_duration": 8.0})
    with pytest.raises(ConfigError, match=r"^runner.max_duration: needs batch_size"):
        prepare_job(SquareRunner(LengthsProvider({"lengths": LENGTHS}), None, tmp_path / "c"), [0], keyed,
                    {"max_duration": 8.0})  # fmt: skip
    assert not (tmp_path / "b").exists()  # nothing started, nothing written


def test_the_driver_hands_the_executor_only_the_shards_its_done_markers_say_must_run(tmp_path):
    """The done marker is the one answer: a finished shard is never handed to the executor (no task, no
    round trip); the driver counts it as cached, with the items its marker records as skipped."""
    from espnet3_prefect.pipeline.driver import drive_stage
    from espnet3_prefect.pipeline.in_process import InProcessExecutor

    class Recording(InProcessExecutor):
        def __init__(self, runner):
            super().__init__(runner)
            self.handed: list[int] = []

        def run_shards(self, stage, shards):
            self.handed += [s.index for s in shards]
            return super().run_shards(stage, shards)

    runner = SquareRunner(LogProvider({}), 2, tmp_path)
    job = prepare_job(runner, range(12), {"env": "local", "n_workers": 2, "num_shards": 4})
    first = Recording(runner)
    summary, _ = drive_stage(job.stage, first, shards=job.shards)
    assert first.handed == [0, 1, 2, 3] and (summary.shards_run, summary.shards_cached) == (4, 0)

    (tmp_path / "split.2" / "done").unlink()
    again = Recording(runner)
    summary, merged = drive_stage(job.stage, again, shards=job.shards)
    assert again.handed == [2] and (summary.shards_run, summary.shards_cached) == (1, 3)
    assert merged == runner.merge([str(tmp_path / f"split.{i}") for i in range(4)])

    done = Recording(runner)
    summary, _ = drive_stage(job.stage, done, shards=job.shards)
    assert done.handed == [] and (summary.shards_run, summary.shards_cached) == (0, 4)
    assert not list(tmp_path.glob(".prefect-cache*"))  # no second record of "done" beside the markers


def test_job_reads_as_its_summary_for_the_api_never_the_runner(tmp_path):
    from fastapi.encoders import jsonable_encoder

    job = prepare_job(
        SquareRunner(LogProvider({"secret": object()}), None, tmp_path), range(5), {"env": "local", "n_workers": 2}
    )
    stored = jsonable_encoder(job)
    assert stored == {
        "runner": "tests.helpers.workloads.SquareRunner",
        "items": 5,
        "shards": 5,
        "batch_size": None,
        "output_dir": str(tmp_path),
        "shard_subdir": "",
        "resume": True,
        "parallel": {"env": "local", "n_workers": 2},
    }
    assert json.dumps(stored)


def test_fingerprint_covers_code_provider_config_batch_size_and_the_index_list(tmp_path):
    def fp(config=None, batch_size=None, indices=(0, 1, 2), cls=SquareRunner):
        runner = cls(LogProvider(config or {"offset": 0}), batch_size, tmp_path)
        return runner_fingerprint(runner, list(indices), batch_size)[0]

    class Other(SquareRunner):
        pass

    base = fp()
    assert base == fp()  # stable
    assert len({base, fp({"offset": 1}), fp(batch_size=2), fp(indices=(0, 2, 1)), fp(cls=Other)}) == 5
    with_parallel = fp({"offset": 0, "parallel": {"n_workers": 9}})
    assert with_parallel == fp({"offset": 0, "parallel": {"n_workers": 1}})  # parallel never changes outputs


def test_indices_must_be_ints(tmp_path):
    assert check_indices([np.int64(3), 1]) == [3, 1]
    for bad, message in [
        ([], "no indices"),
        ([0, 1.5], r"indices\[1\] is 1.5"),
        ([True], r"indices\[0\] is True"),
        (5, "must be an iterable of ints"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_indices(bad)
    with pytest.raises(ConfigError, match="output_dir: not set"):
        prepare_job(SquareRunner(None), [0], None)
    with pytest.raises(ConfigError, match="shard_subdir"):
        prepare_job(SquareRunner(None, None, tmp_path, shard_subdir="../x"), [0], None)


def test_a_worker_reimporting_the_script_is_told_to_guard_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__mp_main__"))
    with pytest.raises(ConfigError, match="put the script's top-level code under"):
        SquareRunner(LogProvider({}), None, tmp_path)([0])


# ---------------------------------------------------------------------------------------- the demo
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return [
        {"name": "a", "data_dir": str(make_corpus(root / "a", 23, seed=3))},
        {"name": "b", "data_dir": str(make_corpus(root / "b", 17, seed=4, noise_db=-20.0))},
    ]


def _stats_run(corpus, out, batch_size):
    provider = FeatsProvider({"data": corpus, "features": {"n_mels": 10}})
    return FeatsRunner(provider, batch_size=batch_size, output_dir=out)(range(40))


def test_stats_are_the_global_mean_and_variance_of_every_feature_frame(corpus, tmp_path):
    result = _stats_run(corpus, tmp_path / "s", None)
    frames = np.concatenate([np.load(line.split()[1]) for line in (tmp_path / "s/feats.scp").read_text().splitlines()])
    assert result["utterances"] == 40 and result["frames"] == frames.shape[0] and frames.shape[1] == 10
    np.testing.assert_allclose(result["mean"], frames.astype(np.float64).mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(result["std"], frames.astype(np.float64).std(axis=0), rtol=1e-8)
    stats = np.load(tmp_path / "s/feats_stats.npz")
    assert sorted(stats.files) == ["count", "sum", "sum_square"] and int(stats["count"]) == frames.shape[0]
    ids = [line.split()[0] for line in (tmp_path / "s/feats.scp").read_text().splitlines()]
    assert ids[0] == "a-dtmf_000000" and ids[-1] == "b-dtmf_000016" and len(set(ids)) == 40


def test_another_shard_plan_changes_statistics_only_by_float_rounding(corpus, tmp_path):
    one = _stats_run(corpus, tmp_path / "many", None)  # 32 shards
    two = _stats_run(corpus, tmp_path / "few", 8)  # 5 shards of 8
    assert len(list((tmp_path / "few").glob("split.*"))) == 5
    assert one["frames"] == two["frames"]
    np.testing.assert_allclose(one["mean"], two["mean"], rtol=1e-12)
    np.testing.assert_allclose(one["std"], two["std"], rtol=1e-12)
    for line_a, line_b in zip(
        (tmp_path / "many/feats.scp").read_text().splitlines(), (tmp_path / "few/feats.scp").read_text().splitlines()
    ):
        assert np.load(line_a.split()[1]).tobytes() == np.load(line_b.split()[1]).tobytes()  # features identical


def test_log_mel_does_not_depend_on_threads_and_npz_bytes_are_reproducible(tmp_path):
    import torch

    wave = np.random.default_rng(0).standard_normal(4000).astype(np.float32) * 0.1
    extractor = LogMel()
    before = torch.get_num_threads()
    assert extractor(wave).tobytes() == pickle.loads(pickle.dumps(extractor))(wave).tobytes()
    assert torch.get_num_threads() == before
    arrays = {"count": np.array(3), "sum": np.arange(3.0)}
    assert write_npz(tmp_path / "a.npz", arrays).read_bytes() == write_npz(tmp_path / "b.npz", arrays).read_bytes()
    assert np.load(tmp_path / "a.npz")["sum"].tolist() == [0.0, 1.0, 2.0]


def test_run_starts_the_workers_fork_server_beside_the_server_only_with_a_shard_to_run(tmp_path):
    """``entry.run``'s hook for the Prefect server's start: there while a shard has no done marker (or
    ``resume`` is off), none once every shard is marked done (the flow then only merges)."""
    runner = SquareRunner(LogProvider({}), 2, tmp_path)
    job = prepare_job(runner, range(8), {"env": "local", "n_workers": 2, "num_shards": 2})
    assert callable(entry._runner_workers_beside(job))
    layout = job.stage.layout
    for shard in job.shards:
        layout.done(shard.index).parent.mkdir(parents=True, exist_ok=True)
        layout.done(shard.index).write_text("{}")
        assert (entry._runner_workers_beside(job) is None) == (shard is job.shards[-1])
    runner.resume = False
    assert callable(entry._runner_workers_beside(prepare_job(runner, range(8), {"env": "local", "num_shards": 2})))
