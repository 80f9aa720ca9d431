"""ESPnet3 202611's second system, F5-TTS, on our recipe recipes/fsdd_f5tts (FSDD recordings, a tiny
DiT, a seeded local Vocos): upstream's serial stages against our three doors on two workers.

The ``fsdd_f5tts`` fixture copies the recipe and the installed ``egs3/TEMPLATE/f5tts`` into a
temporary ``egs3/`` tree, links the FSDD recordings in, writes the vocoder folder, and runs upstream's
``python run.py`` (ESPnet3's own launch): create_dataset, remove_long_short, create_token_list,
collect_stats and train in one call, then infer with ``conf/inference.yaml`` (one worker: the
reference), then infer again into a second folder (upstream's own run-to-run determinism). The tests
then run ours in the same folder on ``conf/inference_parallel.yaml`` (two Dask workers) and compare
every merged file and every waveform it names byte for byte (compare.artifact_problems). No network:
``HF_HUB_OFFLINE=1`` and ``vocoder_path`` is the local folder.

Skips without the real ESPnet (or vocos) or the FSDD recordings; ``E3P_REQUIRE_REAL_ESPNET=1`` turns
the first into a failure. ``E3P_F5TTS_WORKDIR`` keeps the work folder (a finished oracle is reused).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from .compare import artifact_problems, stats_problems
from .conftest import F5_TIMINGS, REQUIRE_VAR, SETUP, Recipe, require_real_espnet
from .test_mini_an4 import cli, fresh

pytestmark = [pytest.mark.realespnet, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RECIPE_SOURCE = ROOT / "recipes" / "fsdd_f5tts" / "egs3" / "fsdd" / "f5tts"
FSDD = ROOT.parent / "shared" / "data" / "fsdd"
WORKDIR_VAR = "E3P_F5TTS_WORKDIR"
DONE_MARK = ".oracle-done"
TRAINING = ("--training_config", "conf/training.yaml")
PARALLEL = "conf/inference_parallel.yaml"
TRAIN_STAGES = ("create_dataset", "remove_long_short", "create_token_list", "collect_stats", "train")
DONE_LINE = re.compile(r"\[DONE\] stage: (?P<stage>\w+) \((?P<seconds>[0-9.]+)s\)")
RUN_PREFECT = """\
from espnet3.systems.f5tts.system import F5TTSSystem
from espnet3_prefect import launch

if __name__ == "__main__":
    launch(F5TTSSystem)
"""


def stage_times(text: str, side: str, suffix: str = "") -> None:
    for match in DONE_LINE.finditer(text):
        F5_TIMINGS.setdefault(match["stage"] + suffix, {})[side] = float(match["seconds"])


def require_f5tts() -> None:
    require_real_espnet()
    for module in ("espnet3.systems.f5tts.inference", "vocos"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            message = f"{module} is not importable here; run: {SETUP}"
            if os.environ.get(REQUIRE_VAR) == "1":
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
    if not (FSDD / "recordings").is_dir():
        pytest.skip(f"FSDD recordings not present at {FSDD} (only beside the project in CI and dev)")


def copy_recipe(dest: Path) -> Path:
    """``dest/egs3/{TEMPLATE/f5tts, fsdd/f5tts}``, FSDD linked in; returns the recipe folder."""
    from importlib.resources import as_file, files

    with as_file(files("egs3")) as installed:
        installed = Path(installed)
        shutil.copytree(installed / "TEMPLATE" / "f5tts", dest / "egs3" / "TEMPLATE" / "f5tts")
        for rel in ("__init__.py", "TEMPLATE/__init__.py"):
            if (installed / rel).is_file():
                shutil.copy2(installed / rel, dest / "egs3" / rel)
    recipe = dest / "egs3" / "fsdd" / "f5tts"
    shutil.copytree(RECIPE_SOURCE, recipe, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "exp", "data"))
    (recipe / "downloads").mkdir()
    (recipe / "downloads" / "fsdd").symlink_to(FSDD.resolve())
    return recipe


def recipe_env(recipe: Path, prefect_home: Path) -> dict[str, str]:
    """path.sh's PYTHONPATH, this venv first on PATH, no GPU, no network, a Prefect home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    egs3 = recipe.parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(egs3.parent), str(egs3 / "TEMPLATE" / "f5tts"), str(recipe)])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONUNBUFFERED"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["ESPNET3_PREFECT_HOME"] = str(prefect_home)
    return env


@pytest.fixture(scope="session")
def fsdd_f5tts(tmp_path_factory) -> Recipe:
    require_f5tts()
    kept = os.environ.get(WORKDIR_VAR)
    root = Path(kept).resolve() if kept else tmp_path_factory.mktemp("fsdd_f5tts")
    done = (root / DONE_MARK).is_file()
    if not done:
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        copy_recipe(root)
    recipe_dir = root / "egs3" / "fsdd" / "f5tts"
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    recipe = Recipe(root, recipe_dir, recipe_env(recipe_dir, root / "prefect-home"), logs)
    if not done:
        recipe.run("make_vocoder", [sys.executable, "local/make_vocoder.py", "exp/vocoder"])
        proc = recipe.upstream("upstream_training_stages", "--stages", *TRAIN_STAGES, *TRAINING)
        stage_times(proc.stdout + proc.stderr, "upstream")
        proc = recipe.upstream(
            "upstream_infer", "--stages", "infer", *TRAINING, "--inference_config", "conf/inference.yaml"
        )
        stage_times(proc.stdout + proc.stderr, "upstream")
        rerun = recipe.conf_copy("conf/inference.yaml", "inference_rerun.yaml")
        proc = recipe.upstream("upstream_infer_rerun", "--stages", "infer", *TRAINING, "--inference_config", rerun)
        stage_times(proc.stdout + proc.stderr, "upstream", " (again)")
        (root / DONE_MARK).write_text("")
    assert (oracle_dir(recipe) / "test" / "wav.scp").is_file(), "the upstream infer left no wav.scp"
    return recipe


def oracle_dir(recipe: Recipe) -> Path:
    return recipe.recipe / "exp" / "training" / "inference"


def assert_same_waveforms(recipe: Recipe, ours: Path, oracle: Path | None = None) -> list[str]:
    problems, compared = artifact_problems(oracle or oracle_dir(recipe), ours, recipe.recipe)
    assert not problems, f"{ours} differs from {oracle or oracle_dir(recipe)}:\n" + "\n".join(problems)
    assert len(compared) == 4, f"expected the 4 test waveforms, compared {compared}"
    return compared


def test_upstream_infer_is_deterministic_across_runs(fsdd_f5tts):
    """Upstream's own serial infer, twice in two processes with seed 0: the same waveforms."""
    rerun = fsdd_f5tts.recipe / "exp" / "training" / "inference_rerun"
    assert_same_waveforms(fsdd_f5tts, rerun)


def test_run_door_matches_upstream(fsdd_f5tts):
    """``espnet3-prefect run --stages infer`` (ESPnet3's launcher, infer as our flow) on two workers."""
    conf = fsdd_f5tts.conf_copy(PARALLEL, "inference_prefect_run.yaml")
    out = fresh(fsdd_f5tts.recipe / "exp" / "training" / "inference_prefect_run")
    cmd = [*cli(), "run", "--stages", "infer", *TRAINING, "--inference_config", conf]
    proc = fsdd_f5tts.run("ours_run_infer", cmd)
    stage_times(proc.stdout + proc.stderr, "ours: run")
    assert_same_waveforms(fsdd_f5tts, out)
    # one flow run of the recipe; the same command again finds the stage done (its record, its outputs)
    assert re.search(r"^infer\s+Completed\s", proc.stdout, re.M), proc.stdout
    again = fsdd_f5tts.run("ours_run_infer_again", cmd)
    assert re.search(r"^infer\s+Cached\s.*inputs unchanged", again.stdout, re.M), again.stdout
    assert (out / "infer.stage.json").is_file()
    assert_same_waveforms(fsdd_f5tts, out)


def test_launch_door_matches_upstream(fsdd_f5tts):
    """A recipe ``run.py`` with ``launch(F5TTSSystem)`` imported from us."""
    conf = fsdd_f5tts.conf_copy(PARALLEL, "inference_prefect_launch.yaml")
    out = fresh(fsdd_f5tts.recipe / "exp" / "training" / "inference_prefect_launch")
    (fsdd_f5tts.recipe / "run_prefect.py").write_text(RUN_PREFECT)
    proc = fsdd_f5tts.run(
        "ours_launch_infer",
        [sys.executable, "run_prefect.py", "--stages", "infer", *TRAINING, "--inference_config", conf],
    )
    stage_times(proc.stdout + proc.stderr, "ours: launch")
    assert_same_waveforms(fsdd_f5tts, out)


def test_cli_door_matches_upstream(fsdd_f5tts):
    """Recipe mode of ``espnet3-prefect infer`` (the system found from the folder name, f5tts)."""
    out = fresh(fsdd_f5tts.recipe / "exp" / "training" / "inference_cli")
    started = time.monotonic()
    fsdd_f5tts.run(
        "ours_cli_infer",
        [
            *cli(),
            "infer",
            "--config",
            PARALLEL,
            f"inference_dir={out.relative_to(fsdd_f5tts.recipe)}",
            "--training-config",
            "conf/training.yaml",
        ],
    )
    F5_TIMINGS.setdefault("infer", {})["ours: cli (command)"] = time.monotonic() - started
    assert_same_waveforms(fsdd_f5tts, out)


def refused_before_start(recipe: Recipe, name: str, cmd: list[str], out: Path, *needles: str) -> None:
    """``cmd`` exits non-zero with one line naming ``model.vocoder_path`` (and ``needles``), no
    traceback, nothing in the inference folder (no shard, no manifest), no Prefect server."""
    proc = recipe.run(name, cmd, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{name}: exit 0\n{said}"
    lines = [line for line in said.splitlines() if "model.vocoder_path" in line]
    assert lines, f"{name}: no line names model.vocoder_path:\n{said}"
    assert all(n in lines[0] for n in needles), f"{name}: {lines[0]!r} lacks {needles}"
    assert "Traceback" not in said, f"{name}: a traceback, not one line:\n{said}"
    assert "Prefect API:" not in said, f"{name}: a server started:\n{said}"
    # ESPnet3's launcher opens the stage's log (<inference_dir>/infer.log) before the stage starts
    made = sorted(p.name for p in out.iterdir() if p.name != "infer.log") if out.exists() else []
    assert not made, f"{name}: {out} holds {made}"


def test_a_missing_vocoder_fails_before_anything_starts(fsdd_f5tts):
    """``vocoder_path`` naming a folder without the Vocos files, through ``infer`` and ``run``."""
    out = fresh(fsdd_f5tts.recipe / "exp" / "training" / "inference_novocoder")
    cmd = [*cli(), "infer", "--config", PARALLEL, f"inference_dir={out.relative_to(fsdd_f5tts.recipe)}"]
    cmd += ["--training-config", "conf/training.yaml", "model.vocoder_path=exp/no_vocoder"]
    refused_before_start(fsdd_f5tts, "ours_cli_no_vocoder", cmd, out, "exp/no_vocoder", "config.yaml")
    conf = fsdd_f5tts.recipe / "conf" / "inference_novocoder.yaml"
    text = (fsdd_f5tts.recipe / PARALLEL).read_text()
    conf.write_text(
        text.replace("vocoder_path: ${recipe_dir}/exp/vocoder", "vocoder_path: ${recipe_dir}/exp/no_vocoder")
    )
    cmd = [*cli(), "run", "--stages", "infer", *TRAINING, "--inference_config", "conf/inference_novocoder.yaml"]
    refused_before_start(fsdd_f5tts, "ours_run_no_vocoder", cmd, out, "no_vocoder")


def test_a_hub_download_without_network_fails_before_anything_starts(fsdd_f5tts):
    """``vocoder_path`` unset: F5TTSInference would fetch charactr/vocos-mel-24khz; the hub is off."""
    out = fresh(fsdd_f5tts.recipe / "exp" / "training" / "inference_hub")
    cmd = [*cli(), "infer", "--config", PARALLEL, f"inference_dir={out.relative_to(fsdd_f5tts.recipe)}"]
    cmd += ["--training-config", "conf/training.yaml", "model.vocoder_path=null"]
    refused_before_start(fsdd_f5tts, "ours_cli_hub_offline", cmd, out, "unset", "HF_HUB_OFFLINE")


def test_collect_stats_on_prefect_matches_upstream(fsdd_f5tts):
    """``espnet3-prefect run --stages collect_stats`` (each runner call a ``run-runner`` flow) on two
    workers against upstream's in-process collect_stats: shapes and keys byte for byte, sums to 1e-5."""
    training = fsdd_f5tts.recipe / "conf" / "training_stats_prefect.yaml"
    text = (fsdd_f5tts.recipe / "conf" / "training.yaml").read_text()
    assert "\nparallel:\n" in text, "conf/training.yaml no longer ends its data stages' parallel block as expected"
    text = text.replace("\nparallel:\n", "\nparallel:\n  env: local\n  n_workers: 2\n")
    assert "\nstats_dir: ${exp_dir}/stats\n" in text, "conf/training.yaml names its stats_dir otherwise"
    training.write_text(
        text.replace("\nstats_dir: ${exp_dir}/stats\n", "\nstats_dir: ${recipe_dir}/exp/stats_prefect\n")
    )
    stats = fresh(fsdd_f5tts.recipe / "exp" / "stats_prefect")
    proc = fsdd_f5tts.run(
        "ours_run_collect_stats",
        [*cli(), "run", "--stages", "collect_stats", "--training_config", str(training.relative_to(fsdd_f5tts.recipe))],
    )
    stage_times(proc.stdout + proc.stderr, "ours: run")
    problems = stats_problems(fsdd_f5tts.recipe / "exp" / "training" / "stats", stats)
    assert not problems, "collect_stats differs from upstream's:\n" + "\n".join(problems)
