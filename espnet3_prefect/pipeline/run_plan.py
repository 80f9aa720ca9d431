"""One ``infer`` run, decided once: :class:`RunPlan`, made by :func:`plan_run`.

Every front door (``espnet3-prefect infer``, ``espnet3_prefect.infer()``, the ``evaluate`` flow) builds
the plan once from the loaded config, checks with it what can be checked before a server starts, asks
it whether the run is already complete, and hands that same object to the flow ``infer`` (its ``plan``
parameter). The flow builds one from ``config`` only when none is handed over: a deployment's run, in
another process. Nothing is kept between runs: the plan lives as long as the call that made it.

What the plan builds, it builds once: the parallel spec and a :class:`~.stage.Stage` per test set
(provider and runner instantiated, config checked), and on first need each test set's dataset on the
driver (``provider.build_dataset``, as ESPnet3's ``infer()`` does) and its sizing (length, fingerprint,
item lengths). Before, a command-line run built each dataset twice on the driver (the input check,
then the flow's sizing) and validated the config twice, the second time skipped only through a
process-wide cache keyed by the config's YAML text (``tests/integration/test_run_plan.py`` counts).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from espnet3_prefect.execution.spec import ParallelSpec, preflight
from espnet3_prefect.pipeline.precheck import check_inputs_before_start
from espnet3_prefect.pipeline.resume import all_complete
from espnet3_prefect.pipeline.sizing import Sizing, checked_dataset, size_dataset
from espnet3_prefect.pipeline.stage import Stage, build_stages


class RunPlan:
    """The loaded ``config``, its parallel ``spec`` and one :class:`~.stage.Stage` per test set, with
    each test set's dataset and sizing built on first need and kept.

    Slotted and not a dataclass on purpose: passed as a flow parameter, Prefect records it as
    ``"<RunPlan>"`` instead of walking (and copying) the runners and datasets it holds; the flow run's
    ``config`` and ``overrides`` parameters keep the record of what ran.
    """

    __slots__ = ("config", "spec", "stages", "preflighted", "inputs_checked", "_datasets", "_sizings")

    def __init__(self, config: DictConfig, spec: ParallelSpec, stages: list[Stage]):
        self.config, self.spec, self.stages = config, spec, stages
        self.preflighted = False  # the backend's checks on this machine passed
        self.inputs_checked = False  # the model's files, the recipe's data, every test set's inputs
        self._datasets: dict[str, Any] = {}
        self._sizings: dict[str, Sizing | None] = {}

    def __reduce__(self):
        # Prefect ships the flow run's parameters to the workers with every task (the flow-run
        # context): the plan stays on the driver, a task sees None. Pickled whole it would carry the
        # runners and the datasets to every task, and a dataset whose class lives in a module the
        # workers cannot import (ESPnet3 loads a recipe's local dataset/ under a synthetic name)
        # killed every worker as it unpickled its first task (found by tests/realespnet/test_mini_an4.py).
        return (left_on_the_driver, ())

    def __repr__(self) -> str:
        names = ", ".join(s.test_set for s in self.stages)
        return f"RunPlan(env={self.spec.env!r}, n_workers={self.spec.n_workers}, test sets: {names})"

    def dataset(self, stage: Stage) -> Any:
        """The test set's dataset, built on the driver and checked (input keys) once; None for a
        provider without ``build_dataset``. A build that fails is not kept: the next need tries again
        (e.g. after the recipe's data was made)."""
        if stage.test_set not in self._datasets:
            self._datasets[stage.test_set] = checked_dataset(stage)
        return self._datasets[stage.test_set]

    def sizing(self, stage: Stage) -> Sizing | None:
        """The test set's size, fingerprints and item lengths (:func:`~.sizing.size_on_driver`), once."""
        if stage.test_set not in self._sizings:
            self._sizings[stage.test_set] = size_dataset(stage, self.dataset(stage))
        return self._sizings[stage.test_set]

    def preflight(self) -> None:
        """The backend's checks on this machine (a missing package, ``local_gpu`` without GPUs), once."""
        if not self.preflighted:
            preflight(self.spec)
            self.preflighted = True

    def check_inputs(self) -> None:
        """Before a server starts, once: the model's files, the recipe's data made on demand, then each
        test set's dataset built and its inputs checked (:mod:`~.precheck`)."""
        if not self.inputs_checked:
            check_inputs_before_start(self.config, self.stages, dataset_of=self.dataset)
            self.inputs_checked = True

    def complete(self) -> list[dict] | None:
        """Every test set's summary when none needs any work (no server, no cluster), else None."""
        return all_complete(self.stages, sizing_of=self.sizing)


def left_on_the_driver() -> None:
    """What a plan (or any object that stays on the driver) unpickles to elsewhere: nothing.

    >>> import pickle
    >>> pickle.loads(pickle.dumps(RunPlan(None, None, []))) is None
    True
    """
    return None


def plan_run(config: DictConfig) -> RunPlan:
    """Validate the loaded infer ``config`` and build its :class:`RunPlan` (nothing runs yet).

    >>> from omegaconf import OmegaConf
    >>> plan_run(OmegaConf.create({"inference_dir": "exp/x"}))
    Traceback (most recent call last):
    ...
    espnet3_prefect.errors.ConfigError: dataset.test: missing; list the test sets as [{name: ...}, ...]
    """
    spec, stages = build_stages(config)
    return RunPlan(config, spec, stages)


__all__ = ["RunPlan", "left_on_the_driver", "plan_run"]
