"""What each of ESPnet3's stages reads and writes, declared as data: the inputs and outputs of the stage rule.

ESPnet3 declares a system's stages itself (``stages = (StageSpec(name, config, log_dir), ...)``: the
order ``all`` runs them in, the config role each reads, the config key of its log folder). This table
adds, per stage name, the part of that role's config that can change what the stage writes
(``reads``/``ignores``) and which files are its outputs (``outputs``):

- ``("tree", KEY)``: every file under the folder ``KEY`` names, less the folders of the other stages
  of the system nested in it (``data_dir`` holds the tokenizer's folder: that one is
  ``train_tokenizer``'s);
- ``("top", KEY)``: the files directly in that folder (``exp_dir``: the checkpoints and
  ``config.yaml``, not the inference folders or TensorBoard logs below it);
- ``("scp", KEY)``: the merged ``*.scp`` files of each test set under that folder (``infer``'s results
  as ESPnet3 lists them; ``measure`` writes its alignments beside them);
- ``("file", KEY, NAME)``: one file in that folder (``measure``'s ``metrics.json``).

Log files (``*.log``, ESPnet3 rotates them to ``train1.log``, ...) and the stage records themselves are
never outputs. A stage the table does not name (``pack_model``, a recipe's own stage) reads its whole
config and has its log folder as a ``tree``; one without a log folder records no outputs.

>>> STAGES["collect_stats"].reads is None, "optimizer" in STAGES["collect_stats"].ignores
(True, True)
>>> STAGES["train"].outputs
(('top', 'exp_dir'),)
>>> io_of("my_stage", "data_dir").outputs, io_of("upload_model", None).outputs
((('tree', 'data_dir'),), ())
"""

from __future__ import annotations

from dataclasses import dataclass

#: keys of the ``parallel`` kind: where a stage runs, never what it writes (``placement``: where each
#: stage runs, :mod:`~espnet3_prefect.recipe.placement`)
PLACEMENT = ("parallel", "placement")

#: training-config keys that only ``train`` reads (optimisation, the trainer, checkpoint choice):
#: editing one reruns ``train`` and what follows, not ``collect_stats``
TRAIN_ONLY = (
    "trainer",
    "fit",
    "optimizer",
    "optimizers",
    "scheduler",
    "schedulers",
    "scheduler_interval",
    "scheduler_monitor",
    "best_model_criterion",
    "init",
    "num_device",
    "num_nodes",
    "stage_log_mode",
)

#: the stages that run as Prefect flows of their own (subflow runs of the recipe's flow run); every other
#: stage is ESPnet3's code run as a task run
PREFECT_STAGES = ("infer", "measure", "collect_stats")

#: what a stage's record file is called, in the stage's log folder: ``<log_dir>/<stage>.stage.json``
RECORD_SUFFIX = ".stage.json"


@dataclass(frozen=True)
class StageIO:
    """What one stage reads (keys of its role's config, dotted for a part of a block: all when
    ``reads`` is None, less the top-level ``ignores``) and what it writes (``outputs``, see the module
    docstring)."""

    reads: tuple[str, ...] | None = None
    ignores: tuple[str, ...] = PLACEMENT
    outputs: tuple[tuple[str, ...], ...] = ()
    #: also part of the stage's inputs: the identity of another role's config (``measure`` scores
    #: what the inference config decoded)
    also_reads_role: str | None = None


STAGES: dict[str, StageIO] = {
    "create_dataset": StageIO(
        # the dataset references it prepares, not the training preprocessor beside them
        reads=(
            "dataset.train",
            "dataset.valid",
            "dataset.test",
            "create_dataset",
            "recipe_dir",
            "data_dir",
            "dataset_dir",
        ),
        outputs=(("tree", "data_dir"),),
    ),
    "train_tokenizer": StageIO(reads=("tokenizer",), outputs=(("tree", "tokenizer.save_path"),)),
    "collect_stats": StageIO(ignores=PLACEMENT + TRAIN_ONLY, outputs=(("tree", "stats_dir"),)),
    "train": StageIO(outputs=(("top", "exp_dir"),)),
    "infer": StageIO(outputs=(("scp", "inference_dir"),)),
    "measure": StageIO(outputs=(("file", "inference_dir", "metrics.json"),), also_reads_role="inference"),
}


def io_of(stage: str, log_dir_key: str | None) -> StageIO:
    """The table's row for ``stage``, else its whole config read and its log folder (ESPnet3's
    ``StageSpec.log_dir``) as its output tree."""
    if stage in STAGES:
        return STAGES[stage]
    return StageIO(outputs=((("tree", log_dir_key),) if log_dir_key else ()))


def is_bookkeeping(name: str) -> bool:
    """A file that is never a stage's output: a log (``train.log``, rotated ``train1.log``), a stage
    record, a temporary file of an atomic write.

    >>> [is_bookkeeping(n) for n in ("train.log", "train3.log", "infer.stage.json", "step1.ckpt")]
    [True, True, True, False]
    """
    return name.endswith(".log") or name.endswith(RECORD_SUFFIX) or (name.startswith(".") and ".tmp-" in name)


__all__ = ["PLACEMENT", "PREFECT_STAGES", "RECORD_SUFFIX", "STAGES", "TRAIN_ONLY", "StageIO", "io_of", "is_bookkeeping"]
