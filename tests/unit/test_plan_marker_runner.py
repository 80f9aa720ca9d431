from __future__ import annotations

import pytest

from espnet3_prefect import BadInputError, BaseRunner, ConfigError, InferenceRunner
from espnet3_prefect.disk.marker import check_marker, shard_files, write_marker
from espnet3_prefect.espnet3.envcall import call_with_env
from espnet3_prefect.espnet3.inference_runner import _utt_id
from espnet3_prefect.pipeline.plan import default_num_shards, plan_shards
from espnet3_prefect.pipeline.shard import drive


@pytest.mark.parametrize("n, k", [(1, 1), (7, 3), (100, 32), (5, 9), (1000, 7)])
def test_plan_is_contiguous_balanced_and_covers_everything(n, k):
    shards = plan_shards("t", n, k)
    assert shards[0].start == 0 and shards[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))
    sizes = [s.n_items for s in shards]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert [s.index for s in shards] == list(range(len(shards)))


def test_default_plan_does_not_depend_on_small_worker_counts():
    assert {default_num_shards(10_000, w) for w in (1, 2, 4, 8, 16)} == {32}
    assert default_num_shards(10_000, 64) == 128


def test_marker_detects_missing_changed_and_truncated_files(tmp_path):
    (tmp_path / "hyp.scp").write_text("u1 a\n")
    expect = {"fingerprint": "f1", "start": 0, "stop": 1, "identity": {"config": {"a": 1}}}
    assert check_marker(tmp_path, expect) == f"{tmp_path.name}: no done marker"
    write_marker(tmp_path, {"fingerprint": "f1", "start": 0, "stop": 1, "identity": {"config": {"a": 1}}})
    assert set(shard_files(tmp_path)) == {"hyp.scp"}
    assert check_marker(tmp_path, expect) is None
    assert "config changed since it ran (config.a)" in check_marker(
        tmp_path, {**expect, "fingerprint": "f2", "identity": {"config": {"a": 2}}}
    )
    assert "the plan now wants [0, 2)" in check_marker(tmp_path, {**expect, "stop": 2})
    (tmp_path / "hyp.scp").write_text("u1 ")
    assert check_marker(tmp_path, expect).endswith("hyp.scp changed since the marker was written")
    (tmp_path / "hyp.scp").unlink()
    assert check_marker(tmp_path, expect).endswith("hyp.scp is missing")


def test_env_injection_by_name_and_conflicts():
    def forward(idx, model):
        return model + idx

    assert call_with_env(forward, 1, env={"model": 10, "dataset": None}) == 11
    with pytest.raises(ConfigError, match="argument 'model' is passed both explicitly and by the provider env"):
        call_with_env(forward, 1, env={"model": 10}, model=3)


@pytest.mark.parametrize("utt", ["", "a b", "a/b", "..", "tab\there", "back\\slash"])
def test_bad_utt_ids_are_rejected(utt):
    with pytest.raises(BadInputError):
        _utt_id(utt, "utt_id")


class _EchoProvider:
    def build_env_local(self):
        return {
            "dataset": [{"utt_id": f"u{i}", "x": i} for i in range(5)],
            "model": lambda x: x if not isinstance(x, list) else x,
            "input_key": "x",
            "idx_key": "utt_id",
        }


def test_inference_runner_writes_one_scp_per_field_in_order(tmp_path):
    def out(data, model_output, idx):
        if isinstance(idx, list):
            return [out(d, m, i) for d, m, i in zip(data, model_output, idx)]
        return {"utt_id": data["utt_id"], "hyp": f"h{model_output}", "score": model_output / 2}

    provider = _EchoProvider()
    env = {**provider.build_env_local(), "output_fn": out}
    runner = InferenceRunner(provider, batch_size=2, output_dir=tmp_path)
    shard = tmp_path / "split.0"
    assert drive(InferenceRunner, [[0, 1], [2, 3], [4]], {**env, "output_dir": str(tmp_path)}, 0) == []
    assert (shard / "hyp.scp").read_text() == "".join(f"u{i} h{i}\n" for i in range(5))
    assert (shard / "score.scp").read_text().splitlines()[3] == "u3 1.5"
    assert (shard / "field_keys.txt").read_text() == "hyp\nscore\n"
    assert runner.merge([shard]) is None
    assert (tmp_path / "hyp.scp").read_bytes() == (shard / "hyp.scp").read_bytes()


def test_runner_batch_size_validation(tmp_path):
    class Echo(BaseRunner):
        @staticmethod
        def forward(idx, **env):
            return idx

    with pytest.raises(ConfigError, match="batch_size: must be a positive integer or null, got 0"):
        Echo(None, batch_size=0, output_dir=tmp_path)(range(3))
    assert list(plan_shards("t", 5, 1, batch_size=2)[0].units()) == [[0, 1], [2, 3], [4]]


def test_base_runner_local_call_with_seed_style_writer_hooks(tmp_path):
    """Seed 000's MyTextRunner shape: custom hooks, close_writers(writers) with no state."""

    class TextRunner(BaseRunner):
        @staticmethod
        def forward(idx, dataset, model, **env):
            return {"utt_id": dataset[idx]["utt_id"], "text": model(dataset[idx]["x"])}

        @staticmethod
        def open_writers(shard_dir, **env):
            return {"text": (shard_dir / "text").open("w", encoding="utf-8")}

        @staticmethod
        def write_record(writers, result, state, **env):
            writers["text"].write(f"{result['utt_id']} {result['text']}\n")

        @staticmethod
        def close_writers(writers):
            for handle in writers.values():
                handle.close()

        def merge(self, shard_dirs):
            (self.output_dir / "text").write_text("".join((d / "text").read_text() for d in shard_dirs))
            return {}

    class Provider:
        def build_env_local(self):
            return {"dataset": [{"utt_id": f"u{i}", "x": i} for i in range(3)], "model": lambda x: x * 10}

    TextRunner(Provider(), output_dir=tmp_path)(range(3))
    assert (tmp_path / "text").read_text() == "u0 0\nu1 10\nu2 20\n"


def test_device_resolution(monkeypatch):
    from espnet3_prefect.espnet3 import provider
    from espnet3_prefect.espnet3.provider import resolve_device

    assert resolve_device({"device": "cuda:3"}) == "cuda:3"
    monkeypatch.setattr(provider, "_cuda_device_count", lambda: 0)
    assert resolve_device({}) == "cpu"
    monkeypatch.setattr(provider, "_cuda_device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device({}) == "cuda:0"
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device({}) == "cuda:1"
    assert resolve_device({"device_index": 0}) == "cuda:0"
    monkeypatch.setenv("LOCAL_RANK", "3")  # a logical index beyond the visible GPUs is an error (ESPnet3's rule)
    with pytest.raises(ConfigError, match="CUDA device 3 does not exist for this process \\(2 visible GPU"):
        resolve_device({})
