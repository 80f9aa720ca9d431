"""A finished metrics stage, recognised without a server: what ``metrics.json`` was computed from.

The flow writes ``<inference_dir>/.metrics.record.json`` after ``metrics.json``: the metrics config's
fingerprint, the test sets, the source of every metric class, the sha256 of every input file it read
and of the ``metrics.json`` it wrote. A re-run (the command line's ``metrics``, the drop-in
``measure()``) whose plan gives the same record, with every file still as recorded, returns the
recorded results without starting a server or a flow run. Anything else runs the flow: no record
(e.g. a folder upstream scored), another config or metric code, an input rewritten by a new ``infer``,
an edited ``metrics.json``. ``dataset:`` inputs (e.g. the reference ``dataset:text``) are read from the
dataset through the inference config: they are vouched for by infer's own completeness check (the
dataset of the same size and fingerprint as at infer's last merge,
:func:`espnet3_prefect.pipeline.resume.all_complete`),
whose merge records join the record; without the inference config such metrics always run.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> (folder / "test").mkdir(); _ = (folder / "test" / "hyp.scp").write_text("u1 a b\\n")
>>> plan = MetricsPlan(folder, ["test"], [MetricSpec(0, "k", "k", object(), {"hyp": "hyp"}, False)], "f0")
>>> settled_results(plan) is None  # nothing recorded yet
True
>>> write_results(plan, {"k": {"test": {"n": 1}}}); settled_results(plan)
{'k': {'test': {'n': 1}}}
>>> _ = (folder / "test" / "hyp.scp").write_text("u1 a c\\n"); settled_results(plan) is None
True
"""

from __future__ import annotations

import json
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text, file_digest
from espnet3_prefect.disk.layout import METRICS_RECORD_NAME
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.metrics.metric_plan import MetricSpec, MetricsPlan, metrics_json  # noqa: F401 - MetricSpec: the example above
from espnet3_prefect.pipeline.resume import all_complete
from espnet3_prefect.pipeline.sizing import code_identity
from espnet3_prefect.pipeline.stage import build_stages

RECORD_VERSION = 1


def write_results(plan: MetricsPlan, results: dict) -> None:
    """Write ``metrics.json`` (ESPnet3's bytes, atomic), then the record that vouches for it."""
    atomic_write_text(plan.output, metrics_json(results))
    record = _expected(plan)
    if record is not None:
        record["output"] = file_digest(plan.output)["sha256"]
        atomic_write_text(_record_path(plan), json.dumps(record, indent=1))
    else:
        _record_path(plan).unlink(missing_ok=True)


def settled_results(plan: MetricsPlan) -> dict | None:
    """The recorded results when nothing they were computed from has changed, else None."""
    # the cheap checks first: no record or an edited metrics.json needs no input hashed, no dataset built
    if not plan.output.is_file():
        return None
    try:
        record = json.loads(_record_path(plan).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    output = record.pop("output", None) if isinstance(record, dict) else None
    if output != file_digest(plan.output)["sha256"] or record != _expected(plan):
        return None
    return json.loads(plan.output.read_text(encoding="utf-8"))


def _record_path(plan: MetricsPlan) -> Path:
    return plan.inference_dir / METRICS_RECORD_NAME


def _expected(plan: MetricsPlan) -> dict | None:
    """The record this plan would write now; None when it cannot vouch (``dataset:`` inputs, a missing input)."""
    inference = _inference_records(plan)
    if inference is None:
        return None
    inputs = {}
    for spec in plan.metrics:
        for test_set in plan.test_sets:
            for path in spec.input_paths(plan.inference_dir, test_set).values():
                if not path.is_file():
                    return None
                inputs[path.relative_to(plan.inference_dir).as_posix()] = file_digest(path)["sha256"]
    return {
        "version": RECORD_VERSION,
        "config": plan.fingerprint,
        "test_sets": list(plan.test_sets),
        "code": code_identity(*dict.fromkeys(type(spec.metric) for spec in plan.metrics)),
        "inputs": dict(sorted(inputs.items())),
        "inference": inference,
    }


def _inference_records(plan: MetricsPlan) -> dict | None:
    """``{test set: sha256 of infer's merge record}`` for the test sets whose ``dataset:`` columns are read
    ({} when none are), when infer has nothing to do for them; None when that cannot be vouched for."""
    test_sets = sorted({test_set for test_set, _ in plan.dataset_columns()})
    if not test_sets:
        return {}
    if plan.inference_config is None:
        return None
    try:
        _, stages = build_stages(plan.inference_config)
    except ConfigError:  # e.g. an inference config that only defines the test sets: nothing to vouch with
        return None
    stages = [s for s in stages if s.test_set in test_sets]
    if len(stages) != len(test_sets) or all_complete(stages) is None:
        return None
    return {s.test_set: file_digest(s.layout.merged_record)["sha256"] for s in stages}


__all__ = ["settled_results", "write_results"]
