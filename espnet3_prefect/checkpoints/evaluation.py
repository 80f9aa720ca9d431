"""What ``evaluate`` runs, planned before anything runs: both configs loaded and validated, the
metrics config filled from the inference one, the model's identity, a checkpoint filled into its
config key, and the fingerprint a history line is compared by (:func:`plan_evaluation`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from omegaconf import OmegaConf

from espnet3_prefect._internal.util import as_list
from espnet3_prefect.checkpoints.checkpoint import checkpoint_info, resolve_key
from espnet3_prefect.config.load import fingerprint, identity_config, load_config, quote_override_value
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.metrics.history import model_identity
from espnet3_prefect.metrics.prepare import prepare_metrics
from espnet3_prefect.pipeline.run_plan import left_on_the_driver, plan_run

MODEL_ID_KEY = "evaluate_model_id"


class EvaluationPlan:
    """What :func:`plan_evaluation` decided, read by key (``plan["inference_dir"]``), and the arguments
    it was made for (``asked``). A front door hands it to the flow ``evaluate`` (its ``plan``
    parameter), which then walks none of it again; slotted and not a mapping, so Prefect records it as
    ``"<EvaluationPlan>"`` instead of copying the configs, runners and datasets it holds."""

    __slots__ = ("asked", "parts")

    def __init__(self, asked: tuple, parts: dict):
        self.asked, self.parts = asked, parts

    def __getitem__(self, key: str):
        return self.parts[key]

    def __iter__(self):
        raise TypeError("an EvaluationPlan is read by key")

    def __reduce__(self):
        # a flow parameter travels with every task of the flow run: this plan stays on the driver
        return (left_on_the_driver, ())

    def made_for(self, *asked) -> bool:
        """Whether this plan answers these arguments of :func:`plan_evaluation`."""
        return self.asked == _asked(*asked)


def checkpoint_override(key: str, path: str | Path, present: bool) -> str:
    """The override that fills dotted ``key`` with checkpoint ``path`` (``+key=...`` when the config
    lacks the key). The path is quoted for Hydra's grammar, so it arrives as that very string whatever
    it holds (``modèle``, ``,``, ``(``, ``~``, a quote, or digits alone):

    >>> checkpoint_override("model.asr_model_file", "/exp/modèle (v2)/1200.pth", present=False)
    "+model.asr_model_file='/exp/modèle (v2)/1200.pth'"
    """
    return f"{'' if present else '+'}{key}={quote_override_value(str(path))}"


def model_id_override(model_id: str) -> str:
    """The override that adds the model's identity to infer's config: quoted, so 16 hex digits that
    happen to read as a number (``1234567890123456``, ``1e10000000000000``) stay a string.

    >>> model_id_override("1e10000000000000")
    "+evaluate_model_id='1e10000000000000'"
    """
    return f"+{MODEL_ID_KEY}={quote_override_value(str(model_id))}"


def inference_dir_override(path: str | Path) -> str:
    """The override that adds infer's ``inference_dir`` to a metrics config, quoted for Hydra's grammar."""
    return f"+inference_dir={quote_override_value(str(path))}"


def dataset_test_override(names: Iterable[str]) -> str:
    """The override that adds ``dataset.test`` as ``[{name: ...}, ...]``, each name quoted (a test set
    named ``2024`` or ``dév,1`` stays that string).

    >>> dataset_test_override(["dev", "2024"])
    "+dataset.test=[{name: 'dev'}, {name: '2024'}]"
    """
    return "+dataset.test=[" + ", ".join(f"{{name: {quote_override_value(name)}}}" for name in names) + "]"


def _asked(infer_config, metrics_config, infer_overrides, metrics_overrides, checkpoint, checkpoint_key) -> tuple:
    lists = (infer_config, metrics_config, infer_overrides, metrics_overrides)
    return (*(tuple(as_list(x)) for x in lists), checkpoint, checkpoint_key)


def plan_evaluation(
    infer_config,
    metrics_config,
    infer_overrides=None,
    metrics_overrides=None,
    checkpoint: str | None = None,
    checkpoint_key: str | None = None,
) -> EvaluationPlan:
    """Load and validate both configs (nothing runs); fill the metrics config from the inference one.

    The metrics config may omit ``inference_dir`` and ``dataset.test``: they come from the
    inference config. A different ``inference_dir`` is an error. With ``checkpoint``, its path
    fills ``checkpoint_key`` of the inference config (:func:`~espnet3_prefect.checkpoints.checkpoint.resolve_key`)
    and the config fingerprint is taken without it (the same config across checkpoints).
    """
    asked = _asked(infer_config, metrics_config, infer_overrides, metrics_overrides, checkpoint, checkpoint_key)
    infer_overrides = list(as_list(infer_overrides))
    ckpt = None
    if checkpoint:
        ckpt = checkpoint_info(checkpoint)
        base = load_config(as_list(infer_config), infer_overrides)
        ckpt["key"] = resolve_key(base, checkpoint_key)
        present = OmegaConf.select(base, ckpt["key"], default="__absent__") != "__absent__"
        infer_overrides.append(checkpoint_override(ckpt["key"], ckpt["path"], present))
    icfg = load_config(as_list(infer_config), as_list(infer_overrides))
    run_plan = plan_run(icfg)
    run_plan.preflight()
    identity = model_identity(icfg)
    i_overrides = list(as_list(infer_overrides))
    if identity["kind"] == "files":  # the checkpoint's content joins infer's fingerprint
        i_overrides.append(model_id_override(identity["id"]))
        run_plan = plan_run(load_config(as_list(infer_config), i_overrides))  # the config infer runs
        run_plan.preflighted = True
    run_plan.check_inputs()  # the demo's data, then input_key: before a server starts
    stages = run_plan.stages
    inference_dir = Path(str(icfg.inference_dir)).expanduser().resolve()
    m_overrides = list(as_list(metrics_overrides))
    probe = load_config(as_list(metrics_config), m_overrides)
    if not probe.get("inference_dir"):
        m_overrides.append(inference_dir_override(inference_dir))
    elif Path(str(probe.inference_dir)).expanduser().resolve() != inference_dir:
        raise ConfigError(
            f"inference_dir: the metrics config reads {probe.inference_dir} but infer writes "
            f"{icfg.inference_dir}; drop it from the metrics config or make them equal"
        )
    if probe.get("dataset") is None or probe.dataset.get("test") is None:
        # ESPnet3's measure() without dataset.test scores inference_dir's folders sorted by name:
        # the same order here, so metrics.json has upstream's bytes whichever stage writes it.
        m_overrides.append(dataset_test_override(sorted(s.test_set for s in stages)))
    mcfg = load_config(as_list(metrics_config), m_overrides)
    mplan = prepare_metrics(mcfg, inference_config=icfg, check_inputs=False)  # dataset: inputs read icfg
    infer_identity = identity_config(icfg)
    if ckpt is not None:
        _drop(infer_identity, ckpt["key"])
    parts = {
        "inference_dir": inference_dir,
        "infer_overrides": i_overrides,
        "run_plan": run_plan,  # infer's, built once: the flow ``evaluate`` hands it to its infer subflow
        "metrics_overrides": m_overrides,
        "identity": identity,
        "metrics_plan": mplan,
        "checkpoint": ckpt,
        "config_fingerprint": fingerprint({"infer": infer_identity, "metrics": mplan.fingerprint}),
    }
    return EvaluationPlan(asked, parts)


def _drop(data: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        data = data.get(key) if isinstance(data, dict) else None
    if isinstance(data, dict):
        data.pop(leaf, None)
