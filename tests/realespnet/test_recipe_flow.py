"""ESPnet's own mini_an4 recipe as one Prefect flow run (``espnet3-prefect run``), stage by stage.

A fresh copy of the recipe from the wheel runs create_dataset, train_tokenizer, collect_stats, train,
infer and measure in one command; its outputs are compared with the upstream oracle's (conftest.py:
``python run.py`` once per stage, in another folder). Training has no seed, so the checkpoints and all
that is decoded with them differ between any two trainings, upstream's own too: the comparison covers
what does not depend on the trained weights (data/, the statistics, config.yaml, the checkpoint
names). Then the same command again (every stage Cached), an edited inference config and an edited
optimizer, and a longer training killed mid-way and resumed.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .compare import stats_problems
from .conftest import METRICS, Recipe, copy_recipe, recipe_env, record_time
from .test_mini_an4 import cli

pytestmark = [pytest.mark.realespnet, pytest.mark.slow]

STAGES = ["create_dataset", "train_tokenizer", "collect_stats", "train", "infer", "measure"]
TRAINING = ["--training_config", "conf/training.yaml"]
SERIAL = ["--inference_config", "conf/inference_serial.yaml"]
ALL = ["--stages", *STAGES, *TRAINING, *SERIAL, *METRICS]
RECIPE = "mini_an4/esp2_asr"


@pytest.fixture(scope="module")
def flow_recipe(mini_an4, tmp_path_factory) -> Recipe:
    """A fresh copy of the recipe (no output yet), beside the oracle's."""
    root = tmp_path_factory.mktemp("recipe_flow")
    recipe_dir = copy_recipe(root)
    logs = root / "logs"
    logs.mkdir()
    return Recipe(root, recipe_dir, recipe_env(recipe_dir, root / "prefect-home"), logs)


def database(recipe: Recipe) -> Path:
    return Path(recipe.env["ESPNET3_PREFECT_HOME"]) / "prefect_home" / "prefect.db"


def flow_runs(recipe: Recipe) -> list[tuple]:
    """``(id, flow name, run name, state name, parent task run id)`` of every flow run, oldest first."""
    with sqlite3.connect(database(recipe)) as db:
        return db.execute(
            "select r.id, f.name, r.name, r.state_name, r.parent_task_run_id from flow_run r "
            "join flow f on r.flow_id = f.id order by r.created"
        ).fetchall()


def children(recipe: Recipe, parent_id: str) -> dict[str, str]:
    """The parent's task runs (a stage's, or the stand-in of a subflow run): ``{name: state name}``."""
    with sqlite3.connect(database(recipe)) as db:
        rows = db.execute("select name, state_name from task_run where flow_run_id = ?", (parent_id,)).fetchall()
    return dict(rows)


def table(stdout: str) -> dict[str, tuple[str, str]]:
    """The stage table the command printed: ``{stage: (state, why)}`` (the columns found by its header)."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("stage ") and line.rstrip().endswith("why"))
    state_at, why_at = lines[header].index("state"), lines[header].index("why")
    rows = {}
    for line in lines[header + 1 :]:
        stage = line[:state_at].strip()
        if stage not in STAGES:
            break
        rows[stage] = (line[state_at:].split("  ")[0].strip(), line[why_at:].strip())
    return rows


def timed(recipe: Recipe, name: str, cmd: list[str], label: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    proc = recipe.run(name, cmd)
    record_time(label, "ours", time.monotonic() - started)
    return proc


def same_bytes_up_to_the_folder(oracle: Path, ours: Path, oracle_root: Path, our_root: Path) -> bool:
    """The manifests name their audio by absolute path: equal once our folder reads as the oracle's."""
    return ours.read_bytes().replace(str(our_root).encode(), str(oracle_root).encode()) == oracle.read_bytes()


def assert_data_and_stats_as_upstreams(ours: Path, oracle: Path) -> None:
    """Every file of ``data/`` (less logs) byte for byte, and the statistics, as the oracle's: what a
    recipe run writes that does not depend on the trained weights, ``config.yaml`` aside."""
    for path in sorted((oracle / "data").rglob("*")):
        rel = path.relative_to(oracle)
        if path.is_file() and not path.name.endswith(".log"):
            assert same_bytes_up_to_the_folder(path, ours / rel, oracle, ours), f"{rel} differs from upstream's"
    problems = stats_problems(oracle / "exp" / "stats", ours / "exp" / "stats")
    assert not problems, "\n".join(problems)


def test_whole_recipe_is_one_flow_run_and_matches_upstream(flow_recipe, mini_an4):
    proc = timed(flow_recipe, "recipe_all", [*cli(), "run", *ALL], "recipe, all stages (one flow run)")
    rows = table(proc.stdout)
    assert {stage: state for stage, (state, _) in rows.items()} == dict.fromkeys(STAGES, "Completed"), proc.stdout
    parents = [run for run in flow_runs(flow_recipe) if run[1] == "recipe"]
    assert [(run[2], run[3], run[4]) for run in parents] == [(RECIPE, "Completed", None)]
    parent = parents[0][0]
    tasks = children(flow_recipe, parent)
    for stage in ("create_dataset", "train_tokenizer", "train"):  # ESPnet3's own: task runs
        assert tasks.get(stage) == "Completed", tasks
    subflows = [run for run in flow_runs(flow_recipe) if run[4] in _task_ids(flow_recipe, parent)]
    assert sorted(run[1] for run in subflows) == ["infer", "metrics", "run-runner", "run-runner"], subflows
    assert all(run[3] == "Completed" for run in subflows)

    ours, oracle = flow_recipe.recipe, mini_an4.recipe
    assert_data_and_stats_as_upstreams(ours, oracle)
    config = "exp/training/config.yaml"
    assert same_bytes_up_to_the_folder(oracle / config, ours / config, oracle, ours), "config.yaml differs"

    def names(folder: Path) -> set[str]:
        return {p.name for p in folder.iterdir() if not p.is_dir() and not p.name.endswith((".log", ".stage.json"))}

    assert names(ours / "exp" / "training") == names(oracle / "exp" / "training")
    metrics = ours / "exp" / "training" / "inference_serial" / "metrics.json"
    assert metrics.is_file()
    for stage, where in (
        ("create_dataset", "data"),
        ("train", "exp/training"),
        ("measure", "exp/training/inference_serial"),
    ):
        assert (ours / where / f"{stage}.stage.json").is_file(), f"no record of {stage} in {where}"


def _task_ids(recipe: Recipe, parent_id: str) -> set[str]:
    with sqlite3.connect(database(recipe)) as db:
        return {row[0] for row in db.execute("select id from task_run where flow_run_id = ?", (parent_id,))}


def test_the_same_command_again_is_all_cached(flow_recipe):
    outputs = {p: p.stat().st_mtime_ns for p in (flow_recipe.recipe / "exp").rglob("*") if p.is_file()}
    before = len(flow_runs(flow_recipe))
    proc = timed(flow_recipe, "recipe_again", [*cli(), "run", *ALL], "recipe again, every stage Cached")
    rows = table(proc.stdout)
    assert {stage: state for stage, (state, _) in rows.items()} == dict.fromkeys(STAGES, "Cached"), proc.stdout
    assert all("inputs unchanged" in why for _, why in rows.values())
    runs = flow_runs(flow_recipe)[before:]
    assert [(run[1], run[3]) for run in runs] == [("recipe", "Completed")]  # no stage's flow ran
    assert set(children(flow_recipe, runs[0][0]).values()) == {"Cached"}
    changed = [p for p, ns in outputs.items() if p.is_file() and p.stat().st_mtime_ns != ns and p.suffix != ".log"]
    assert not changed, f"written again: {changed}"
    # what would run, starting nothing
    dry = flow_recipe.run("recipe_stages", [*cli(), "stages", *ALL])
    assert {stage: state for stage, (state, _) in table(dry.stdout).items()} == dict.fromkeys(STAGES, "Cached")
    assert len(flow_runs(flow_recipe)) == len(runs) + before


def test_an_edited_inference_config_reruns_infer_and_measure_only(flow_recipe):
    conf = flow_recipe.recipe / "conf" / "inference_serial.yaml"
    text = conf.read_text()
    assert "beam_size: 1" in text
    conf.write_text(text.replace("beam_size: 1", "beam_size: 2"))
    try:
        proc = timed(flow_recipe, "recipe_beam2", [*cli(), "run", *ALL], "recipe, beam_size edited")
    finally:
        conf.write_text(text)
    rows = table(proc.stdout)
    assert [s for s, (state, _) in rows.items() if state != "Cached"] == ["infer", "measure"], proc.stdout
    assert rows["infer"][1].endswith("config changed: model.beam_size (1 -> 2)"), rows["infer"]


def test_an_edited_optimizer_reruns_train_not_the_statistics(flow_recipe):
    conf = flow_recipe.recipe / "conf" / "training_asr_streaming.yaml"
    text = conf.read_text()
    assert "  lr: 0.005\n" in text
    conf.write_text(text.replace("  lr: 0.005\n", "  lr: 0.004\n"))
    try:
        proc = flow_recipe.run("recipe_lr", [*cli(), "run", "--stages", *STAGES[:4], *TRAINING])
    finally:
        conf.write_text(text)
    rows = table(proc.stdout)
    assert [s for s, (state, _) in rows.items() if state != "Cached"] == ["train"], proc.stdout
    assert "config changed: optimizer.lr (0.005 -> 0.004)" in rows["train"][1]


def test_a_placed_train_runs_as_one_job_and_records_as_here(flow_recipe, mini_an4):
    """``placement: {train: {env: local}}`` in the training config (ESPnet3 reads no such key): train runs
    in a child process, ESPnet3's own ``run_stages`` there writes its ``train.log`` and the checkpoints
    upstream's train writes (the statistics it reads are those of the first run: ``stats_dir`` is shared)."""
    recipe = flow_recipe.recipe
    text = (recipe / "conf" / "training.yaml").read_text()
    (recipe / "conf" / "training_placed.yaml").write_text(text + "\nplacement:\n  train:\n    env: local\n")
    cmd = [*cli(), "run", "--stages", "train", "--training_config", "conf/training_placed.yaml"]
    proc = timed(flow_recipe, "recipe_placed", cmd, "train placed (env local: one child process)")
    assert table(proc.stdout) == {"train": ("Completed", "no finished run recorded")}, proc.stdout
    header = [line for line in proc.stdout.splitlines() if line.startswith("stage ")]
    assert header and "node-h" in header[-1]  # a stage ran as a job: its cost has a column
    exp = recipe / "exp" / "training_placed"
    result = json.loads((exp / ".stage-jobs" / "train" / "result.json").read_text())
    assert result["state"] == "done" and result["job_id"] is None  # a child process: no scheduler job
    log = (exp / "train.log").read_text()
    assert "=== [START] stage: train ===" in log and "=== [DONE] stage: train" in log
    said = proc.stdout + proc.stderr
    assert "train: process " in said and " submitted; its output: " in said, said[-3000:]

    def names(folder: Path) -> set[str]:
        return {p.name for p in folder.iterdir() if not p.is_dir() and not p.name.endswith((".log", ".stage.json"))}

    assert names(exp) == names(mini_an4.recipe / "exp" / "training")  # upstream's one train (ours retrained)


def test_train_killed_mid_way_resumes_from_its_last_checkpoint(flow_recipe):
    """40 epochs of one step, a checkpoint each; SIGKILL once step 3's is written; the re-run resumes
    train (the stages before it Cached), then infer and measure run on its last checkpoint."""
    recipe = flow_recipe.recipe
    streaming = (recipe / "conf" / "training_asr_streaming.yaml").read_text()
    assert "  max_epochs: 1\n" in streaming
    (recipe / "conf" / "training_long.yaml").write_text(streaming.replace("  max_epochs: 1\n", "  max_epochs: 40\n"))
    serial = (recipe / "conf" / "inference_serial.yaml").read_text()
    last = serial.replace("${exp_dir}/epoch0_step1_valid.loss.ckpt", "${exp_dir}/last.ckpt")  # whichever epoch is best
    assert last != serial
    (recipe / "conf" / "inference_long.yaml").write_text(last)
    cmd = [*cli(), "run", "--stages", *STAGES, "--training_config", "conf/training_long.yaml"]
    cmd += ["--inference_config", "conf/inference_long.yaml", *METRICS]
    exp = recipe / "exp" / "training_long"
    log = flow_recipe.logs / "recipe_train_killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=recipe, env=flow_recipe.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 600
        while not (exp / "step3.ckpt").is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert (exp / "step3.ckpt").is_file(), log.read_text()[-3000:]
    assert not (exp / "step40.ckpt").exists(), "training finished before it was killed"
    record = (exp / "train.stage.json").read_text()
    assert '"status": "started"' in record

    resumed = timed(flow_recipe, "recipe_train_resumed", cmd, "40-epoch train killed at step 3: re-run resumes")
    rows = table(resumed.stdout)
    assert [rows[s][0] for s in STAGES[:3]] == ["Cached"] * 3, resumed.stdout
    assert [rows[s][0] for s in STAGES[3:]] == ["Completed"] * 3  # train, then infer and measure on its model
    said = resumed.stdout + resumed.stderr
    resume_lines = [line for line in said.splitlines() if "train: resuming from exp/training_long/step" in line]
    assert resume_lines, said[-3000:]
    assert "Restoring states from the checkpoint path" in said  # Lightning's own word: it loaded the loop
    assert (exp / "step40.ckpt").is_file()

    fresh = timed(flow_recipe, "recipe_train_rerun", [*cmd, "--rerun", "train"], "--rerun train (step 0)")
    said = fresh.stdout + fresh.stderr
    rows = table(fresh.stdout)
    assert [rows[s] for s in STAGES[3:]] == [("Completed", "--rerun train")] * 3, fresh.stdout
    assert "resuming from" not in said and "Restoring states from the checkpoint path" not in said


def test_a_failing_stage_fails_the_recipe_on_one_line(flow_recipe):
    """A tokenizer whose text builder does not import: the stage fails, the recipe's flow run fails with
    the stage's name and the first line of its error, and the later stages do not start."""
    streaming = (flow_recipe.recipe / "conf" / "training_asr_streaming.yaml").read_text()
    broken = streaming.replace("func: src.tokenizer.gather_training_text", "func: src.no_such_module.gather")
    broken = broken.replace("  vocab_size: 30\n", "  vocab_size: 31\n")  # a tokenizer not trained yet
    assert broken.count("no_such_module") == 1 and "vocab_size: 31" in broken
    (flow_recipe.recipe / "conf" / "training_broken.yaml").write_text(broken)
    cmd = [*cli(), "run", "--stages", *STAGES[:3], "--training_config", "conf/training_broken.yaml"]
    proc = flow_recipe.run("recipe_broken", cmd, check=False)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    expected = "error: stage 'train_tokenizer' failed: ModuleNotFoundError: No module named 'src.no_such_module'"
    assert errors == [expected], proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert rows["create_dataset"][0] == "Cached" and rows["train_tokenizer"][0] == "Failed", proc.stdout
    assert rows["collect_stats"] == ("Not run", "train_tokenizer failed")
    parent = [run for run in flow_runs(flow_recipe) if run[1] == "recipe"][-1]
    assert parent[3] == "Failed"
    assert children(flow_recipe, parent[0]).get("train_tokenizer") == "Failed"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_deployment_runs_the_recipe_from_prefect_yaml(flow_recipe, tmp_path):
    """``prefect deployment run recipe/local`` (deploy-local: a server and a process worker, prefect.yaml
    deployed) with the recipe folder as its workdir: every stage, in the worker's flow run, as
    ``espnet3-prefect run`` runs them (those done before Cached, infer and measure of a new inference
    config run)."""
    from tests.helpers.procs import deploy_local

    recipe = flow_recipe.recipe
    (recipe / "conf" / "inference_deploy.yaml").write_text((recipe / "conf" / "inference_serial.yaml").read_text())

    def recipe_paths(project, env):  # the worker runs the recipe with path.sh's PYTHONPATH and PATH
        env["PYTHONPATH"] = os.pathsep.join([flow_recipe.env["PYTHONPATH"], env["PYTHONPATH"]])
        env["PATH"], env["CUDA_VISIBLE_DEVICES"] = flow_recipe.env["PATH"], ""

    prefect = str(Path(sys.executable).with_name("prefect"))
    with deploy_local(tmp_path, prepare=recipe_paths) as (proc, state, env):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        env = {**env, "PREFECT_API_URL": state["api_url"]}
        configs = {"training": "conf/training.yaml", "inference": "conf/inference_deploy.yaml"}
        configs["metrics"] = "conf/metrics.yaml"
        cmd = [prefect, "deployment", "run", "recipe/local", "--watch", "--watch-interval", "1"]
        cmd += ["--param", f"workdir={recipe}", "--param", f"stages={json.dumps(STAGES)}"]
        cmd += ["--param", f"configs={json.dumps(configs)}"]
        started = time.monotonic()
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        record_time("recipe/local deployment (infer + measure run)", "ours", time.monotonic() - started)
        said = run.stdout + run.stderr
        assert run.returncode == 0 and "Completed" in said, said[-4000:]
    out = recipe / "exp" / "training" / "inference_deploy"
    assert (out / "metrics.json").is_file() and (out / "infer.stage.json").is_file()
    assert '"status": "done"' in (out / "measure.stage.json").read_text()
