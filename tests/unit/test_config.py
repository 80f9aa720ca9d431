from __future__ import annotations

import importlib.util

import pytest

from espnet3_prefect import load_config
from espnet3_prefect.config.load import for_test_set, identity_config, list_test_sets
from espnet3_prefect.config.targets import resolve_target
from espnet3_prefect.pipeline.stage import build_stages
from tests.conftest import toy_config, write_yaml


def test_files_merge_left_to_right_with_interpolations_and_overrides(tmp_path):
    base = write_yaml(
        tmp_path / "inference.yaml",
        {"exp": "exp/x", "inference_dir": "${exp}/inf", "parallel": {"env": "local", "n_workers": 1}},
    )
    over = write_yaml(tmp_path / "parallel_slurm.yaml", {"parallel": {"env": "slurm", "n_workers": 8}})
    cfg = load_config([base, over], ["parallel.n_workers=4", "exp=exp/y"])
    assert cfg.parallel.env == "slurm" and cfg.parallel.n_workers == 4
    assert cfg.inference_dir == "exp/y/inf"


_WITHOUT_ESPNET3 = pytest.mark.skipif(
    importlib.util.find_spec("espnet3") is not None, reason="espnet3 is installed: its stock paths are its own classes"
)


@_WITHOUT_ESPNET3
def test_espnet3_stock_targets_resolve_to_ours():
    assert (
        resolve_target("espnet3.systems.base.inference_provider.InferenceProvider")
        == "espnet3_prefect.espnet3.provider.InferenceProvider"
    )
    assert resolve_target("my.own.Runner") == "my.own.Runner"


@_WITHOUT_ESPNET3
def test_espnet3_recipe_config_runs_unchanged(tmp_path):
    cfg = toy_config(tmp_path)
    cfg["provider"]["_target_"] = "espnet3.systems.base.inference_provider.InferenceProvider"
    cfg["runner"]["_target_"] = "espnet3.systems.base.inference_runner.InferenceRunner"
    cfg["provider"]["params"] = {}
    _, [stage] = build_stages(load_config([write_yaml(tmp_path / "c.yaml", cfg)]))
    assert type(stage.runner).__module__ == "espnet3_prefect.espnet3.inference_runner"
    assert stage.runner.idx_key == "utt_id"


def test_no_parallel_block_means_local_one_worker(tmp_path):
    cfg = toy_config(tmp_path)
    del cfg["parallel"]
    spec, _ = build_stages(load_config([write_yaml(tmp_path / "c.yaml", cfg)]))
    assert (spec.env, spec.n_workers) == ("local", 1)


def test_fingerprint_ignores_how_it_runs_but_not_what_it_computes(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", toy_config(tmp_path))
    fp = lambda *o: build_stages(load_config([path], list(o)))[1][0].work.fingerprint
    base = fp()
    assert fp("parallel.n_workers=7", "runner.retries=5", "runner.resume=false") == base
    assert fp("model.scale=4") != base
    assert fp("batch_size=8") != base


def test_adding_a_test_set_does_not_change_the_others(tmp_path):
    cfg = toy_config(tmp_path)
    one = load_config([write_yaml(tmp_path / "a.yaml", cfg)])
    cfg["dataset"]["test"].append({"name": "test_b", "n": 3})
    two = load_config([write_yaml(tmp_path / "b.yaml", cfg)])
    assert list_test_sets(two) == ["test_a", "test_b"]
    assert identity_config(for_test_set(one, "test_a")) == identity_config(for_test_set(two, "test_a"))


@_WITHOUT_ESPNET3
def test_a_typo_in_a_stock_espnet3_class_name_says_so_and_suggests_the_class():
    from espnet3_prefect.config.targets import locate
    from espnet3_prefect.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        locate("espnet3.systems.base.inference_provider.InferenceProvidr", "provider._target_")
    assert str(info.value) == (
        "provider._target_: 'espnet3.systems.base.inference_provider.InferenceProvidr' is not an ESPnet3 class "
        "espnet3-prefect provides while espnet3 is not installed; did you mean "
        "'espnet3.systems.base.inference_provider.InferenceProvider'?"
    )
    with pytest.raises(ConfigError, match="has no attribute 'InferenceRuner'; did you mean 'InferenceRunner'"):
        locate("espnet3_prefect.espnet3.inference_runner.InferenceRuner", "runner._target_")


@pytest.mark.skipif(
    importlib.util.find_spec("espnet3") is None,
    reason="espnet3 is not importable: run in .venv-espnet (bash scripts/real_espnet_setup.sh)",
)
@pytest.mark.parametrize("first", ["ours", "espnet3"])
def test_resolvers_do_not_clash_with_espnet3s_whichever_registers_first(tmp_path, first):
    """ESPnet3's config_utils registers load_line/self_name/config_path on import without replace=True
    (a recipe's dataset/builder.py imports it, also inside a worker): loading a config first must not
    make that import fail, and its resolvers then read our per-file paths."""
    import subprocess
    import sys

    (tmp_path / "lines.txt").write_text("a\nb\n")
    write_yaml(tmp_path / "c.yaml", {"words": "${load_line:lines.txt}", "name": "${self_name:}"})
    ours = (
        "from espnet3_prefect import load_config; "
        f"cfg = load_config([{str(tmp_path / 'c.yaml')!r}]); assert list(cfg.words) == ['a', 'b'], cfg; "
        "assert cfg.name == 'c', cfg"
    )
    theirs = "import espnet3.utils.config_utils"
    steps = [ours, theirs] if first == "ours" else [theirs, ours]
    done = subprocess.run([sys.executable, "-c", "; ".join(steps)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
