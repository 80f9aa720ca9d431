"""A recipe's own entry point on Prefect: ``launch(ASRSystem)`` in ``run.py``, or ``espnet3-prefect run``.

ESPnet3's recipes end their ``run.py`` with ``launch(ASRSystem)``. Changing that import to ours runs
the same stages, with the same arguments (``--stages``, ``--training_config``, ``--inference_config``,
``--metrics_config``, ...), and configs loaded by ESPnet3's own launcher (the system's ``egs3.TEMPLATE``
defaults merged under each file, ``exp_tag``/``exp_dir`` copied from the training config,
``inference_dir`` named after the inference file): only the parallel stages change hands.

    # run.py                                  # was: from espnet3.systems.launch import launch
    from espnet3.systems.esp2_asr.system import ASRSystem
    from espnet3_prefect import launch

    if __name__ == "__main__":
        launch(ASRSystem)

- ``infer``: the Prefect flow ``infer`` (:func:`espnet3_prefect.infer`), on the ``DaskTaskRunner`` built
  from the inference config's ``parallel`` block; a finished stage starts nothing.
- ``measure``: the flow ``metrics`` (:func:`espnet3_prefect.measure`); a finished stage starts nothing.
- ``collect_stats``: ESPnet3's own stage, whose every runner call (one per split) runs as the flow
  ``run-runner`` on the training config's ``parallel`` block instead of ESPnet3's Dask client.
- every other stage (``create_dataset``, ``train_tokenizer``, ``train``, pack/upload) runs as ESPnet3
  runs it, unchanged.

Needs espnet3 installed (``pip install "espnet==202611"``): the launcher, the systems and the TEMPLATE
configs are ESPnet3's.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from espnet3_prefect.errors import ConfigError, Espnet3PrefectError, one_line
from espnet3_prefect.execution.process_parallel import DEFAULT_PARALLEL
from espnet3_prefect.recipe.launcher import default_system, set_system_wrapper
from espnet3_prefect.recipe.table import PREFECT_STAGES

logger = logging.getLogger("espnet3_prefect")


def launch(
    system_cls: type, *, conf_package: str | None = None, argv: Sequence[str] | None = None, parser: Any = None
) -> None:
    """ESPnet3's ``launch(system_cls, ...)`` as one Prefect flow run, ``recipe``, whose children are the
    stages (same arguments, plus ``--rerun STAGE``): a stage that is done is Cached, ``train`` resumes
    from its last checkpoint, ``--dry_run`` prints what would run and starts nothing. The stage table
    is printed at the end (:mod:`espnet3_prefect.recipe`)."""
    from espnet3_prefect.recipe.driver import StageFailed, StageInterrupted, StageRow, format_rows, plan_table
    from espnet3_prefect.recipe.launcher import load_recipe

    _espnet3_launch()
    with errors_without_traceback(logging.getLogger("espnet3")):
        run = load_recipe(on_prefect(system_cls), conf_package=conf_package, argv=argv, parser=parser)
        # ESPnet3's console logs INFO from every logger: not each request of Prefect's HTTP client
        logging.getLogger("httpx").setLevel(logging.WARNING)
        if run.dry_run:
            print(format_rows(plan_table(run)), flush=True)
            return
        from espnet3_prefect.entry import run_recipe
        from espnet3_prefect.server.embedded import one_server

        check_first_stage(run)

        from prefect.exceptions import CancelledRun

        try:
            with one_server():
                rows = [StageRow(**row) for row in run_recipe(run)]
        except (StageFailed, StageInterrupted) as exc:
            print(format_rows(exc.rows), flush=True)
            raise
        except CancelledRun as exc:
            print(format_rows(run.rows), flush=True)
            raise Espnet3PrefectError(f"recipe {run.name}: {one_line(exc)}") from None
    print(format_rows(rows), flush=True)


#: where :func:`check_first_stage` leaves the plan of an ``infer`` it checked, on the system
CHECKED_INFER_PLAN = "_espnet3_prefect_infer_plan"


def check_first_stage(run: Any) -> None:
    """The first stage the recipe run will run, when it is ``infer`` or ``measure``, checked as that
    stage checks itself, before the recipe's server starts: its config mistake is one line and nothing
    starts. (A later stage is checked when it starts: its inputs are made by the stages before it.)"""
    from espnet3_prefect.entry import plan_infer, prepare_measure
    from espnet3_prefect.recipe.driver import CACHED, plan_table

    first = next((row.stage for row in plan_table(run) if row.state != CACHED), None)
    system = run.system
    if first == "infer":
        plan = plan_infer(system.inference_config)
        plan.check_inputs()  # the model's own files (F5-TTS's vocoder), the data, each test set's inputs
        setattr(system, CHECKED_INFER_PLAN, plan)
    elif first == "measure":
        prepare_measure(system.metrics_config, system.inference_config)


@contextlib.contextmanager
def errors_without_traceback(stage_logger: logging.Logger) -> Iterator[None]:
    """While the block runs, ESPnet3's launcher logs a stage that failed on one of our errors (a config
    mistake found before anything started, e.g. ``model.vocoder_path``) without the traceback: the
    error is raised on, and the command line says it in one line.

    >>> import io
    >>> stream, log = io.StringIO(), logging.getLogger("e3p-doctest-stage")
    >>> log.addHandler(logging.StreamHandler(stream)); log.propagate = False
    >>> with errors_without_traceback(log):
    ...     try:
    ...         raise ConfigError("model.vocoder_path: no such folder")
    ...     except ConfigError:
    ...         log.exception("Stage 'infer' failed")
    >>> stream.getvalue().splitlines()
    ["Stage 'infer' failed"]
    """

    def drop_traceback(record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], Espnet3PrefectError):
            record.exc_info, record.exc_text = None, None
        return True

    stage_logger.addFilter(drop_traceback)
    try:
        yield
    finally:
        stage_logger.removeFilter(drop_traceback)


def on_prefect(system_cls: type) -> type:
    """A subclass of ``system_cls`` whose ``infer``, ``measure`` and ``collect_stats`` run on Prefect.

    It keeps the class's module and name, so ESPnet3 finds the same ``egs3.TEMPLATE`` defaults for it
    (e.g. ``egs3.TEMPLATE.esp2_asr`` for ``ASRSystem``) and logs the same system name.
    """
    if not isinstance(system_cls, type):
        raise ConfigError(f"launch: expected a system class such as ASRSystem, got {system_cls!r}")
    if getattr(system_cls, "_espnet3_prefect_base", None) is not None:
        return system_cls
    return type(
        system_cls.__name__,
        (system_cls,),
        {
            "__module__": system_cls.__module__,
            "__qualname__": system_cls.__qualname__,
            "__doc__": system_cls.__doc__,
            "_espnet3_prefect_base": system_cls,
            "infer": _infer,
            "measure": _measure,
            "collect_stats": _collect_stats,
        },
    )


# -- the stages that change hands ------------------------------------------------------------------


def _infer(self, *args, **kwargs):
    """Run inference on the configured test sets as the Prefect flow ``infer``."""
    _no_stage_args("infer", args, kwargs)
    from espnet3_prefect.entry import infer_planned

    return infer_planned(self.inference_config, self.__dict__.pop(CHECKED_INFER_PLAN, None))


def _measure(self, *args, **kwargs):
    """Score the inference outputs as the Prefect flow ``metrics``; returns what ESPnet3's measure returns."""
    _no_stage_args("measure", args, kwargs)
    from espnet3_prefect.entry import measure

    result = measure(self.metrics_config, inference_config=self.inference_config)
    logger.info("results: %s", result)
    return result


def _collect_stats(self, *args, **kwargs):
    """ESPnet3's collect_stats, each of its runner calls a run of the Prefect flow ``run-runner``."""
    base = type(self)._espnet3_prefect_base
    parallel = (self.training_config or {}).get("parallel") or DEFAULT_PARALLEL
    with espnet3_runners_on_prefect(parallel):
        return base.collect_stats(self, *args, **kwargs)


def _no_stage_args(stage: str, args: tuple, kwargs: dict) -> None:
    if args or kwargs:
        raise TypeError(f"stage {stage!r} takes no arguments; put its settings in the YAML config")


@contextlib.contextmanager
def espnet3_runners_on_prefect(parallel: Any) -> Iterator[None]:
    """While the block runs, ``runner(indices)`` on any ``espnet3.parallel.base_runner.BaseRunner`` is a
    run of the flow ``run-runner`` on ``parallel`` (:func:`espnet3_prefect.run`), not ESPnet3's Dask client."""
    from espnet3.parallel.base_runner import BaseRunner

    from espnet3_prefect.entry import run

    def call(runner, indices):
        flat, batch_size = _unbatched(list(indices), getattr(runner, "batch_size", None), type(runner).__name__)
        saved = runner.batch_size
        runner.batch_size = batch_size
        try:
            return run(runner, flat, parallel=parallel)
        finally:
            runner.batch_size = saved

    original = BaseRunner.__dict__["__call__"]
    BaseRunner.__call__ = call
    try:
        yield
    finally:
        BaseRunner.__call__ = original


def _unbatched(indices: list, batch_size: int | None, name: str) -> tuple[list[int], int | None]:
    """ESPnet3's runners also take ready-made batches (lists of ints, ``batch_size`` None), as its
    ``collect_stats`` passes them: the flat list and their size, when they are the consecutive chunks
    ``batch_size`` would form (ours are cut the same way), else a one-line error.

    >>> _unbatched([[0, 1], [2, 3], [4]], None, "R"), _unbatched([0, 1, 2], 2, "R")
    (([0, 1, 2, 3, 4], 2), ([0, 1, 2], 2))
    """
    if batch_size is not None or not indices or not isinstance(indices[0], (list, tuple)):
        return indices, batch_size
    size = len(indices[0])
    flat = [i for batch in indices for i in batch]
    if size == 0 or [list(b) for b in indices] != [flat[i : i + size] for i in range(0, len(flat), size)]:
        raise ConfigError(
            f"{name}: its batches are not consecutive chunks of one size; give a flat list of "
            f"indices and set batch_size instead"
        )
    return flat, size


set_system_wrapper(on_prefect)  # a deployment's recipe flow builds its run with it


def _espnet3_launch():
    try:
        return importlib.import_module("espnet3.systems.launch").launch
    except ImportError as exc:
        raise ConfigError(
            f'launch: ESPnet3\'s launcher does not import ({exc}); pip install "espnet[asr]==202611"'
        ) from None


__all__ = [
    "PREFECT_STAGES",
    "default_system",
    "errors_without_traceback",
    "espnet3_runners_on_prefect",
    "launch",
    "on_prefect",
]
