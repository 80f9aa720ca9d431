"""One recipe run, stage by stage: for each stage ESPnet3's launcher resolved, in its order, either the
stage is done (Cached, :mod:`~espnet3_prefect.recipe.rule`) or ESPnet3's own stage code runs it, between
its two records (:mod:`~espnet3_prefect.recipe.record`). A failed stage ends the run: later stages do
not run, as in ESPnet3.

The driver knows nothing of Prefect: it is given an executor (``flows/recipe.py`` makes each stage a
task run or a subflow run) with two methods, ``cached(stage, reason)`` and ``run(stage, call, why)``.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from espnet3_prefect.errors import Espnet3PrefectError, one_line
from espnet3_prefect.recipe import system as sysview
from espnet3_prefect.recipe.outputs import digest, manifest, output_files
from espnet3_prefect.recipe.placement import placements, run_placed
from espnet3_prefect.recipe.record import DONE, STARTED, StageRecord, read_record, record_path, write_record
from espnet3_prefect.recipe.resume import last_checkpoint, resume_from, step_of
from espnet3_prefect.recipe.rule import (
    config_section,
    espnet_version,
    input_change,
    named_files,
    recipe_modules,
    redo_reason,
)
from espnet3_prefect.recipe.table import PREFECT_STAGES, io_of

log = logging.getLogger("espnet3_prefect")

CACHED, COMPLETED, FAILED, NOT_RUN, CANCELLED = "Cached", "Completed", "Failed", "Not run", "Cancelled"


class StageFailed(Espnet3PrefectError):
    """A stage of the recipe raised: the message names the stage and the first line of its error;
    ``rows`` is the stage table up to it (the later stages Not run)."""

    def __init__(self, message: str, rows: list[StageRow]):
        super().__init__(message)
        self.rows = rows

    def __reduce__(self):
        return (StageFailed, (str(self), self.rows))


class StageInterrupted(KeyboardInterrupt):
    """The run was interrupted during a stage (Ctrl-C, or a cancel from the UI): ``rows`` is the stage
    table up to it (that stage Cancelled, the later ones Not run). A KeyboardInterrupt still: the front
    doors treat it as the Ctrl-C it is."""

    def __init__(self, stage: str, rows: list[StageRow]):
        super().__init__(f"interrupted during stage {stage!r}")
        self.stage, self.rows = stage, rows


@dataclass
class StageRow:
    """One line of the stage table: what happened to a stage in this run."""

    stage: str
    state: str
    seconds: float | None = None
    outputs: int | None = None
    why: str = ""
    #: a placed stage's cost: its job's node-hours (one node for the seconds its payload ran)
    node_hours: float | None = None

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "state": self.state,
            "seconds": self.seconds,
            "outputs": self.outputs,
            "why": self.why,
            "node_hours": self.node_hours,
        }


class StageExecutor(Protocol):
    def cached(self, stage: str, reason: str) -> None: ...

    def run(self, stage: str, call: Any, why: str) -> None: ...


@dataclass
class RecipeRun:
    """A recipe run decided once, on the driver, before a server starts: the system ESPnet3's launcher
    built from the configs, the stages it resolved (ESPnet3's order), its parsed arguments, and
    ``run_stage(stage)``: ESPnet3's own ``run_stages`` for that one stage (its ``[START]``/``[DONE]``
    lines and ``<stage>.log``). Pickles to None: Prefect records it as a parameter, workers never need it."""

    name: str
    system: Any
    stages: list[str]
    rerun: list[str]
    root: Path
    run_stage: Any
    dry_run: bool = False
    configs: dict[str, str] = field(default_factory=dict)
    #: each stage's config section, taken before any stage runs: ESPnet3's stages change the config
    #: they are given (``collect_stats`` drops ``model.normalize``), and a stage's inputs are the
    #: config as the launcher built it
    sections: dict[str, dict] = field(default_factory=dict)
    #: the role configs as the launcher built them, copied before any stage runs
    pristine: dict[str, Any] = field(default_factory=dict)
    #: where a stage runs when not here: ``{stage: spec}`` from the configs' ``placement`` blocks
    placed: dict[str, Any] = field(default_factory=dict)
    #: the jobs placed stages ran as in this run: ``{stage: JobOutcome}``
    jobs: dict[str, Any] = field(default_factory=dict)
    #: set when the run is to stop (a cancel): a placed stage's job is cancelled, no later stage starts
    stop: Any = None
    #: the stage table of the run's end (what the front door prints)
    rows: list = field(default_factory=list)

    def __post_init__(self):
        self.placed = self.placed or placements(self.system)
        for stage in self.stages:
            self.sections.setdefault(stage, config_section(self.system, stage))
        for name, value in vars(self.system).items():
            if name.endswith("_config") and value is not None:
                self.pristine.setdefault(name, copy.deepcopy(value))

    def fresh_configs(self) -> None:
        """Give the system the configs as the launcher built them, as a ``run.py`` call per stage has
        them: ESPnet3's ``collect_stats`` removes ``model.normalize`` from the config it is given, and
        in one process ``train`` would build its model without it; here each stage reads its own copy,
        whichever stages ran before it in this process."""
        for name, value in self.pristine.items():
            setattr(self.system, name, copy.deepcopy(value))

    def stage_call(self, stage: str):
        """What runs ``stage``: ESPnet3's ``run_stages`` for it, here or as one job where it is placed."""
        if stage not in self.placed:
            return lambda: self.run_stage(stage)

        def placed() -> None:
            self.jobs[stage] = run_placed(self, stage, self.placed[stage], self.stop)

        return placed

    def __reduce__(self):
        return (_gone, ())

    def __repr__(self) -> str:
        return f"<RecipeRun {self.name}: {' '.join(self.stages)}>"

    def forced(self, stage: str) -> bool:
        """Whether ``--rerun`` asks for this stage: it, or an earlier stage of this run, is named."""
        if "all" in self.rerun:
            return True
        order = self.stages
        return any(name in order and order.index(name) <= order.index(stage) for name in self.rerun)

    def upstream(self, stage: str) -> dict[str, str]:
        """The output digest of every earlier stage of the system with a record (``unfinished`` for one
        whose last run did not finish)."""
        names = sysview.stage_names(self.system)
        digests = {}
        for name in names[: names.index(stage)]:
            record = read_record(record_path(self.system, name))
            if record is not None:
                digests[name] = record.digest if record.done else "unfinished"
        return digests

    def decide(self, stage: str) -> tuple[str | None, StageRecord | None, dict]:
        """``(why it runs, or None when Cached; its record; its inputs now)``."""
        record = read_record(record_path(self.system, stage))
        section = self.sections[stage]
        inputs = {
            "config": section,
            "files": named_files(section, self.root),
            "espnet": espnet_version(),
            "upstream": self.upstream(stage),
        }
        if self.forced(stage):
            named = "all" if "all" in self.rerun else next(n for n in self.rerun if n in self.stages)
            return f"--rerun {named}", record, inputs
        return redo_reason(record, inputs, self.root), record, inputs


def _gone():
    return None


def plan_table(run: RecipeRun) -> list[StageRow]:
    """What a run would do, starting nothing (``--dry_run``, ``espnet3-prefect stages``): a stage after
    one that runs is decided once that one has run (Cached if its outputs come out the same)."""
    rows, running = [], None
    for stage in run.stages:
        why, record, _ = run.decide(stage)
        if why is None and running is None:
            rows.append(StageRow(stage, CACHED, None, len(record.outputs), f"{record.done_line()}, inputs unchanged"))
            continue
        if why is None:
            why = f"after {running}: Cached if {running}'s outputs come out the same"
        rows.append(StageRow(stage, "to run", None, None, why))
        running = running or stage
    return rows


def drive_recipe(run: RecipeRun, executor: StageExecutor) -> list[StageRow]:
    """Run the recipe's stages in order (see the module docstring); returns the stage table."""
    rows: list[StageRow] = []
    for stage in run.stages:
        if run.stop is not None and run.stop.is_set():  # cancelled as the stage before it ended
            rows += [StageRow(later, NOT_RUN, why="cancelled") for later in run.stages[len(rows) :]]
            raise StageInterrupted(stage, rows)
        why, record, inputs = run.decide(stage)
        if why is None:
            reason = f"{record.done_line()}, inputs unchanged, {len(record.outputs)} outputs intact"
            executor.cached(stage, reason)
            rows.append(StageRow(stage, CACHED, None, len(record.outputs), reason))
            continue
        run.fresh_configs()
        if stage == "train":
            why = _resume_train(run, record, inputs, why)
        elif stage in PREFECT_STAGES and record is not None and record.done:
            forget_done_shards(run.system, stage)  # a finished stage that reruns starts over
        try:
            rows.append(_run_one(run, executor, stage, inputs, why))
        except KeyboardInterrupt:
            rows.append(StageRow(stage, CANCELLED, why="interrupted; a re-run resumes it"))
            rows += [StageRow(later, NOT_RUN, why=f"{stage} interrupted") for later in run.stages[len(rows) :]]
            raise StageInterrupted(stage, rows) from None
        except Exception as exc:
            if run.stop is not None and run.stop.is_set():  # the stage ended because the run was cancelled
                rows.append(StageRow(stage, CANCELLED, why="cancelled; a re-run resumes it"))
                rows += [StageRow(later, NOT_RUN, why=f"{stage} cancelled") for later in run.stages[len(rows) :]]
                raise StageInterrupted(stage, rows) from None
            line = first_line(exc)
            rows.append(StageRow(stage, FAILED, why=line))
            rows += [StageRow(later, NOT_RUN, why=f"{stage} failed") for later in run.stages[len(rows) :]]
            raise StageFailed(f"stage {stage!r} failed: {line}", rows) from exc
    return rows


def format_rows(rows: list[StageRow]) -> str:
    """The stage table as the terminal shows it (a ``node-h`` column when a stage ran as a job).

    >>> print(format_rows([StageRow("train", CACHED, 12.3, 4, "done 2026-11-28 10:00:00, inputs unchanged")]))
    stage  state   seconds  outputs  why
    train  Cached     12.3        4  done 2026-11-28 10:00:00, inputs unchanged
    >>> print(format_rows([StageRow("train", COMPLETED, 72.0, 4, "no finished run recorded", 0.0193)]))
    stage  state      seconds  node-h  outputs  why
    train  Completed     72.0  0.0193        4  no finished run recorded
    """
    jobs = any(row.node_hours is not None for row in rows)
    cells = [("stage", "state", "seconds", *(("node-h",) if jobs else ()), "outputs", "why")]
    for row in rows:
        seconds = "" if row.seconds is None else f"{row.seconds:.1f}"
        node_hours = ("" if row.node_hours is None else f"{row.node_hours:.4f}",) if jobs else ()
        outputs = "" if row.outputs is None else str(row.outputs)
        cells.append((row.stage, row.state, seconds, *node_hours, outputs, row.why))
    count = len(cells[0]) - 1
    widths = [max(len(line[i]) for line in cells) for i in range(count)]
    aligned = ("<", "<", *(">",) * (count - 2))
    out = []
    for line in cells:
        padded = [f"{cell:{side}{width}}" for cell, side, width in zip(line, aligned, widths)]
        out.append("  ".join([*padded, line[-1]]).rstrip())
    return "\n".join(out)


def first_line(exc: BaseException) -> str:
    """The first line of an error, with its type unless it is one of ours (already one line).

    >>> first_line(RuntimeError("CUDA out of memory.\\nTried to allocate")), first_line(StageFailed("x", []))
    ('RuntimeError: CUDA out of memory.', 'x')
    """
    lines = str(exc).strip().splitlines()
    first = one_line(lines[0]) if lines else ""
    if isinstance(exc, Espnet3PrefectError):
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _run_one(run: RecipeRun, executor: StageExecutor, stage: str, inputs: dict, why: str) -> StageRow:
    path = record_path(run.system, stage)
    started = StageRecord(stage, STARTED, inputs)
    write_record(path, started)
    log.info("stage %s: runs (%s)", stage, why)
    executor.run(stage, run.stage_call(stage), why)
    outputs = manifest(output_files(run.system, stage), run.root)
    finished = time.time()
    write_record(
        path,
        StageRecord(
            stage,
            DONE,
            {
                **inputs,
                # as they are now: a file the config names may be one the stage wrote (its stats file)
                "files": named_files(inputs["config"], run.root),
                "modules": recipe_modules(run.root),
            },
            outputs,
            digest(outputs),
            started.started_at,
            finished,
            round(finished - started.started_at, 3),
        ),
    )
    job = run.jobs.get(stage)
    node_hours = round(job.running_s / 3600, 4) if job is not None else None
    return StageRow(stage, COMPLETED, round(finished - started.started_at, 1), len(outputs), why, node_hours)


def forget_done_shards(system: Any, stage: str) -> int:
    """Remove the shard done markers (``split.N/done``) under a stage's output folders, so that its
    flow redoes every shard: its own check sees its config and code, not that ``train`` wrote a new
    checkpoint or that ``--rerun`` was asked. An unfinished stage keeps them and resumes."""
    removed = 0
    for _, key, *_ in io_of(stage, sysview.spec_of(system, stage).log_dir).outputs:
        root = sysview.folder(system, stage, key)
        for marker in root.glob("**/split.*/done") if root is not None and root.is_dir() else ():
            marker.unlink(missing_ok=True)
            removed += 1
    if removed:
        log.info("%s: its %d finished shards are redone", stage, removed)
    return removed


def _resume_train(run: RecipeRun, record: StageRecord | None, inputs: dict, why: str) -> str:
    """When the last ``train`` with these inputs did not finish and left a checkpoint, train from it."""
    if run.forced("train") or record is None or record.done or input_change(record.inputs, inputs):
        return why
    exp_dir = sysview.folder(run.system, "train", "exp_dir")
    checkpoint = last_checkpoint(exp_dir, record.started_at) if exp_dir is not None else None
    if checkpoint is None:
        return why
    resume_from(sysview.config_of(run.system, "training"), checkpoint)
    shown = checkpoint.relative_to(run.root.resolve()) if run.root.resolve() in checkpoint.parents else checkpoint
    line = f"train: resuming from {shown} (step {step_of(checkpoint)}): the last train with these inputs did not finish"
    log.warning("%s", line)
    return line


__all__ = [
    "CACHED",
    "CANCELLED",
    "COMPLETED",
    "FAILED",
    "NOT_RUN",
    "RecipeRun",
    "StageExecutor",
    "StageFailed",
    "StageInterrupted",
    "StageRow",
    "drive_recipe",
    "first_line",
    "forget_done_shards",
    "format_rows",
    "plan_table",
]
