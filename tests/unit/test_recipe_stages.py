"""The recipe's stage rule, records and loop (espnet3_prefect.recipe), on a small system of real files.

The system below is shaped as ESPnet3 202611 declares one (``stages``: name, config role, log folder
key; ``<role>_config`` attributes; ``_default_log_dir``), and its stages write real files where
ESPnet3's do (``data_dir``, ``exp_dir``, ``inference_dir``). The loop runs them through an executor
that only calls them; the Prefect flow around it is tested in tests/integration/test_recipe_flow.py
and on ESPnet's own mini_an4 in tests/realespnet/test_recipe_flow.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from espnet3_prefect.recipe.driver import (
    CACHED,
    COMPLETED,
    FAILED,
    NOT_RUN,
    RecipeRun,
    StageFailed,
    drive_recipe,
    plan_table,
)
from espnet3_prefect.recipe.record import STARTED, read_record, record_path

Spec = SimpleNamespace


class ToySystem:
    """Four stages as ESPnet3 declares them; each writes its outputs from its config."""

    stages = (
        Spec(name="create_dataset", config="training", log_dir="data_dir"),
        Spec(name="train", config="training", log_dir="exp_dir"),
        Spec(name="infer", config="inference", log_dir="inference_dir"),
        Spec(name="measure", config="metrics", log_dir="inference_dir"),
    )

    def __init__(self, training, inference, metrics):
        self.training_config = OmegaConf.create(training)
        self.inference_config = OmegaConf.create(inference)
        self.metrics_config = OmegaConf.create(metrics)
        self._default_log_dir = Path("exp")
        self.ran: list[str] = []
        self.fail: str | None = None

    def create_dataset(self):
        data = Path(self.training_config.data_dir)
        (data / "manifest").mkdir(parents=True, exist_ok=True)
        (data / "manifest" / "train.tsv").write_text(f"utt1\t{self.training_config.dataset.train[0].split}\n")
        (data / "create_dataset.log").write_text(f"{time.time()}\n")  # a log: never an output

    def train(self):
        exp = Path(self.training_config.exp_dir)
        exp.mkdir(parents=True, exist_ok=True)
        (exp / "config.yaml").write_text(OmegaConf.to_yaml(self.training_config))
        (exp / "step1.ckpt").write_text(f"weights after lr {self.training_config.optimizer.lr}\n")
        self.training_config.model.pop("normalize", None)  # as ESPnet3's collect_stats mutates its config

    def infer(self):
        out = Path(self.inference_config.inference_dir) / "test"
        out.mkdir(parents=True, exist_ok=True)
        (out / "text.scp").write_text(f"utt1 beam{self.inference_config.beam_size}\n")
        (out / "split.0").mkdir(exist_ok=True)
        (out / "split.0" / "done").write_text("{}")

    def measure(self):
        out = Path(self.metrics_config.inference_dir)
        (out / "metrics.json").write_text(json.dumps({"WER": {"test": {"WER": 1.0}}}))


class Calls:
    """The driver's executor without Prefect: runs a stage's call, notes what was Cached."""

    def __init__(self):
        self.reasons: dict[str, str] = {}

    def cached(self, stage, reason):
        self.reasons[stage] = reason

    def run(self, stage, call, why):
        call()


def configs(**changes):
    training = {
        "data_dir": "data",
        "exp_dir": "exp/train",
        "dataset": {"train": [{"split": "train"}], "preprocessor": {"token_list": "data/bpe_30/tokens.txt"}},
        "optimizer": {"lr": 0.1},
        "model": {"normalize": "utterance_mvn", "size": 2},
        "parallel": {"env": "local", "n_workers": 1},
    }
    inference = {"inference_dir": "exp/train/inference", "beam_size": 1, "parallel": {"env": "local"}}
    metrics = {"inference_dir": "exp/train/inference", "metrics": [{"name": "wer"}]}
    for dotted, value in changes.items():
        role, _, key = dotted.partition("__")
        target = {"training": training, "inference": inference, "metrics": metrics}[role]
        *parents, leaf = key.split("__")
        for part in parents:
            target = target[part]
        target[leaf] = value
    return training, inference, metrics


def recipe_run(stages=("create_dataset", "train", "infer", "measure"), rerun=(), system=None, **changes):
    system = system or ToySystem(*configs(**changes))

    def run_stage(stage):
        if system.fail == stage:
            raise RuntimeError(f"{stage} broke\nsecond line")
        system.ran.append(stage)
        getattr(system, stage)()

    return RecipeRun("toy/asr", system, list(stages), list(rerun), Path.cwd(), run_stage)


def drive(run):
    calls = Calls()
    rows = drive_recipe(run, calls)
    return {row.stage: row for row in rows}, calls


@pytest.fixture(autouse=True)
def in_recipe_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_second_run_finds_every_stage_done_and_runs_nothing():
    first, _ = drive(recipe_run())
    assert {row.state for row in first.values()} == {COMPLETED}
    assert first["create_dataset"].outputs == 1  # the manifest; the log is not an output
    again = recipe_run()
    rows, calls = drive(again)
    assert again.system.ran == []
    assert {row.state for row in rows.values()} == {CACHED}
    assert set(calls.reasons) == {"create_dataset", "train", "infer", "measure"}
    assert "inputs unchanged, 1 outputs intact" in calls.reasons["create_dataset"]
    record = read_record(record_path(again.system, "train"))
    assert record.done and sorted(record.outputs) == ["exp/train/config.yaml", "exp/train/step1.ckpt"]
    assert Path("data/create_dataset.stage.json").is_file()  # beside the stage's outputs, in its log folder


def test_an_edited_inference_config_reruns_infer_and_measure_only():
    drive(recipe_run())
    run = recipe_run(inference__beam_size=4)
    rows, _ = drive(run)
    assert run.system.ran == ["infer", "measure"]
    assert rows["infer"].why == "config changed: beam_size (1 -> 4)"
    assert rows["measure"].why.startswith("config changed: inference.beam_size")
    assert Path("exp/train/inference/test/text.scp").read_text() == "utt1 beam4\n"


def test_an_edited_training_key_reruns_train_and_what_its_new_outputs_feed():
    drive(recipe_run())
    run = recipe_run(training__optimizer__lr=0.2)
    rows, _ = drive(run)
    assert run.system.ran == ["train", "infer", "measure"]
    assert rows["create_dataset"].state == CACHED  # reads dataset/data_dir only, not optimizer
    assert rows["train"].why == "config changed: optimizer.lr (0.1 -> 0.2)"
    assert rows["infer"].why == "train's outputs changed"


def test_placement_is_not_an_input():
    drive(recipe_run())
    run = recipe_run(training__parallel={"env": "slurm", "n_workers": 8}, inference__parallel={"env": "slurm"})
    rows, _ = drive(run)
    assert run.system.ran == [] and {row.state for row in rows.values()} == {CACHED}


def test_a_rerun_that_writes_the_same_bytes_changes_nothing_after_it():
    drive(recipe_run())
    run = recipe_run(rerun=["create_dataset"], stages=("create_dataset",))
    drive(run)
    later = recipe_run()
    rows, _ = drive(later)
    assert later.system.ran == []  # create_dataset's digest is the same: train and the rest stay done


def test_rerun_a_stage_reruns_it_and_every_later_one():
    drive(recipe_run())
    run = recipe_run(rerun=["train"])
    rows, _ = drive(run)
    assert run.system.ran == ["train", "infer", "measure"]
    assert rows["create_dataset"].state == CACHED
    assert rows["train"].why == rows["measure"].why == "--rerun train"
    everything = recipe_run(rerun=["all"])
    drive(everything)
    assert everything.system.ran == ["create_dataset", "train", "infer", "measure"]


def test_a_finished_infer_that_reruns_starts_over():
    drive(recipe_run())
    done = Path("exp/train/inference/test/split.0/done")
    seen = []
    run = recipe_run(rerun=["infer"], stages=("infer",))
    original = run.run_stage
    run.run_stage = lambda stage: (seen.append(done.exists()), original(stage))
    drive(run)
    assert seen == [False]  # its shard markers went before its flow ran: every shard is redone


def test_missing_or_changed_outputs_rerun_the_stage():
    drive(recipe_run())
    Path("exp/train/inference/metrics.json").unlink()
    run = recipe_run()
    rows, _ = drive(run)
    assert run.system.ran == ["measure"]
    assert rows["measure"].why == "output missing: exp/train/inference/metrics.json"
    manifest = Path("data/manifest/train.tsv")
    manifest.write_text("utt1\tedited\n")
    run = recipe_run(stages=("create_dataset",))
    rows, _ = drive(run)
    assert rows["create_dataset"].why == "output changed: data/manifest/train.tsv"


def test_a_touched_but_unchanged_output_is_intact():
    drive(recipe_run())
    os.utime("data/manifest/train.tsv", ns=(1, 1))  # mtime moved, content the same (a copy, a touch)
    run = recipe_run()
    drive(run)
    assert run.system.ran == []


def test_a_stage_that_did_not_finish_runs_again_and_says_so():
    drive(recipe_run())
    run = recipe_run(rerun=["train"])
    run.system.fail = "train"
    with pytest.raises(StageFailed, match=r"^stage 'train' failed: RuntimeError: train broke$") as caught:
        drive(run)
    states = {row.stage: row.state for row in caught.value.rows}
    assert states == {"create_dataset": CACHED, "train": FAILED, "infer": NOT_RUN, "measure": NOT_RUN}
    assert read_record(record_path(run.system, "train")).status == STARTED
    again = recipe_run()
    rows, _ = drive(again)
    assert again.system.ran == ["train"]  # it wrote the bytes it had written before: infer, measure stay done
    assert rows["train"].why.startswith("the run started ") and rows["train"].why.endswith(" did not finish")


def test_recipe_code_and_espnet_version_are_inputs(tmp_path):
    code = tmp_path / "src"
    code.mkdir()
    (code / "__init__.py").write_text("")
    (code / "toy_recipe_code.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import src.toy_recipe_code  # noqa: F401 - a recipe module the stages run

        drive(recipe_run())
        record = read_record(record_path(ToySystem(*configs()), "train"))
        assert record.inputs["modules"]["src/toy_recipe_code.py"]
        (code / "toy_recipe_code.py").write_text("VALUE = 2\n")
        run = recipe_run()
        rows, _ = drive(run)
        assert rows["create_dataset"].why == "recipe code changed: src/toy_recipe_code.py"
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("src.toy_recipe_code", "src"):
            sys.modules.pop(name, None)
    path = record_path(ToySystem(*configs()), "measure")
    data = json.loads(path.read_text())
    data["inputs"]["espnet"] = "202505"
    path.write_text(json.dumps(data))
    rows, _ = drive(recipe_run(stages=("measure",)))
    assert rows["measure"].why.startswith("espnet 202505 -> ")


def test_each_stage_reads_the_config_as_the_launcher_built_it():
    """ESPnet3's collect_stats pops model.normalize from the config it is given; a later stage of the
    same process still reads it (as a run.py call per stage does), and a re-run is Cached."""
    run = recipe_run()
    seen = []
    original = run.run_stage
    run.run_stage = lambda stage: (seen.append("normalize" in run.system.training_config.model), original(stage))
    drive(run)
    assert seen == [True, True, True, True]
    assert {row.state for row in drive(recipe_run())[0].values()} == {CACHED}


def test_train_resumes_from_the_interrupted_runs_last_checkpoint():
    drive(recipe_run(stages=("create_dataset",)))
    run = recipe_run(stages=("create_dataset", "train"))
    run.system.fail = "train"
    with pytest.raises(StageFailed):
        drive(run)
    exp = Path("exp/train")
    exp.mkdir(parents=True, exist_ok=True)
    for step in (1, 2):
        (exp / f"step{step}.ckpt").write_text(f"step {step}\n")
    (exp / "last.ckpt").symlink_to("step2.ckpt")
    again = recipe_run(stages=("create_dataset", "train"))
    seen = []
    original = again.run_stage
    again.run_stage = lambda stage: (seen.append(again.system.training_config.get("fit")), original(stage))
    rows, _ = drive(again)
    assert seen == [{"ckpt_path": str((exp / "step2.ckpt").resolve())}]
    assert rows["train"].why.startswith("train: resuming from exp/train/step2.ckpt (step 2)")
    fresh = recipe_run(stages=("train",), rerun=["train"])  # --rerun train: from step 0
    seen.clear()
    original = fresh.run_stage
    fresh.run_stage = lambda stage: (seen.append(fresh.system.training_config.get("fit")), original(stage))
    drive(fresh)
    assert seen == [None]


def test_dry_run_table_says_what_would_run_and_starts_nothing():
    drive(recipe_run())
    run = recipe_run(training__optimizer__lr=0.3)
    rows = {row.stage: row for row in plan_table(run)}
    assert run.system.ran == []
    assert rows["create_dataset"].state == CACHED
    assert (rows["train"].state, rows["train"].why) == ("to run", "config changed: optimizer.lr (0.1 -> 0.3)")
    assert rows["infer"].why == "after train: Cached if train's outputs come out the same"


def test_a_file_the_config_names_is_an_input_by_content():
    """The nightly case: the inference config names a checkpoint that training keeps rewriting."""
    Path("exp").mkdir()
    Path("exp/latest.ckpt").write_text("weights 1\n")
    drive(recipe_run(inference__model_file="exp/latest.ckpt"))
    os.utime("exp/latest.ckpt", ns=(5, 5))  # touched, same content: still done
    run = recipe_run(inference__model_file="exp/latest.ckpt")
    drive(run)
    assert run.system.ran == []
    Path("exp/latest.ckpt").write_text("weights 2\n")
    run = recipe_run(inference__model_file="exp/latest.ckpt")
    rows, _ = drive(run)
    assert run.system.ran == ["infer", "measure"]
    assert rows["infer"].why == "input file changed: exp/latest.ckpt"


def test_create_dataset_reads_its_references_not_the_preprocessor_beside_them():
    drive(recipe_run())
    other_tokenizer = Path("data/bpe_31")  # a tokenizer another training config made inside data_dir
    other_tokenizer.mkdir()
    (other_tokenizer / "bpe.model").write_text("model\n")
    (other_tokenizer / "train_tokenizer.stage.json").write_text("{}")  # that stage's record
    run = recipe_run(training__dataset={"train": [{"split": "train"}], "preprocessor": {"token_list": "x"}})
    rows, _ = drive(run)
    assert rows["create_dataset"].state == CACHED
    run = recipe_run(training__dataset={"train": [{"split": "train-clean"}], "preprocessor": {"token_list": "x"}})
    rows, _ = drive(run)
    assert rows["create_dataset"].why.startswith("config changed: dataset.train")
    record = read_record(record_path(run.system, "create_dataset"))
    assert list(record.outputs) == ["data/manifest/train.tsv"]  # not the other stage's folder
