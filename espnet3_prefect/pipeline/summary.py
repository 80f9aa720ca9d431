"""Report's input: what running a stage's shards gave (:class:`ShardOutcome`) and the stage's closing
summary (:class:`StageSummary`), typed here and turned into the plain dict the flows return, the
summary table reads and the UI's artifact shows only at the edge (:meth:`StageSummary.to_dict`).

>>> outcome = ShardOutcome(cached=3)
>>> (outcome.run, outcome.cached, outcome.failed)
(0, 3, 0)
>>> s = StageSummary(test_set="test_clean", shards=3, items=30, shards_run=0, shards_cached=3, seconds=0.1)
>>> s.to_dict()["shards_cached"], "items_run" in s.to_dict()
(3, False)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ShardOutcome:
    """The shards of one stage after they ran: how many ran, came from the cache or their done markers,
    how many items were skipped (``on_error: skip``), the batch jobs they ran in, and the summed
    timing of the shards that ran (:func:`espnet3_prefect.pipeline.report.add_timing`)."""

    run: int = 0
    cached: int = 0
    failed: int = 0
    jobs: set[str] = field(default_factory=set)
    timing: dict[str, Any] | None = None


@dataclass
class StageSummary:
    """One stage's closing summary: counts and seconds, never data. ``test_set`` is the test set (or the
    runner class of a ``run-runner`` stage); ``outputs`` the merged files by name; ``workers`` how many
    workers built the env (0: no cluster started); ``items_run`` the items of the shards that ran
    (infer only)."""

    test_set: str
    shards: int
    items: int
    shards_run: int
    shards_cached: int
    seconds: float
    failed: int = 0
    outputs: dict[str, str] = field(default_factory=dict)
    workers: int = 0
    jobs: list[str] = field(default_factory=list)
    timing: dict[str, Any] | None = None
    items_run: int | None = None
    #: where the items' lengths came from and their unit (``{"source", "unit"}``), when known
    lengths: dict[str, Any] | None = None

    @classmethod
    def of(
        cls,
        test_set: str,
        shards: list,
        items: int,
        outcome: ShardOutcome,
        *,
        seconds: float,
        outputs: dict[str, str] | None = None,
        workers: int = 0,
        items_run: int | None = None,
        lengths: dict[str, Any] | None = None,
    ) -> StageSummary:
        """The summary of a stage whose ``shards`` ran as ``outcome`` says."""
        return cls(
            test_set=test_set,
            shards=len(shards),
            items=items,
            shards_run=outcome.run,
            shards_cached=outcome.cached,
            failed=outcome.failed,
            jobs=sorted(outcome.jobs),
            seconds=seconds,
            outputs=dict(outputs or {}),
            workers=workers,
            timing=outcome.timing,
            items_run=items_run,
            lengths=lengths,
        )

    def to_dict(self) -> dict[str, Any]:
        """The plain dict the flows return (``items_run`` and ``lengths`` only where known)."""
        out = dataclasses.asdict(self)
        for key in ("items_run", "lengths"):
            if out[key] is None:
                del out[key]
        return out
