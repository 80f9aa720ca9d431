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
from pathlib import Path
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
    #: seconds of audio the stage generated (waveform outputs: TTS), when counted
    generated_s: float | None = None

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
        generated_s: float | None = None,
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
            generated_s=generated_s,
        )

    def to_dict(self) -> dict[str, Any]:
        """The plain dict the flows return (``items_run``, ``lengths`` and ``generated_s`` only where known)."""
        out = dataclasses.asdict(self)
        for key in ("items_run", "lengths", "generated_s"):
            if out[key] is None:
                del out[key]
        return out


def audio_seconds(outputs: dict[str, str]) -> float | None:
    """Seconds of audio the merged ``*.scp`` outputs name: every value that is a ``.wav`` file (a TTS
    stage's waveforms, ``split.N/<field>/<id>.wav``), read from its header; relative values are
    relative to the working folder, as ESPnet3 writes them. None when no output names a wav (ASR).

    >>> import tempfile, numpy as np, soundfile as sf
    >>> from pathlib import Path
    >>> tmp = Path(tempfile.mkdtemp())
    >>> sf.write(tmp / "a.wav", np.zeros(12000, dtype=np.float32), 8000)
    >>> _ = (tmp / "wav.scp").write_text(f"a {tmp / 'a.wav'}\\n")
    >>> _ = (tmp / "text.scp").write_text("a hello\\n")
    >>> audio_seconds({"wav.scp": str(tmp / "wav.scp")}), audio_seconds({"text.scp": str(tmp / "text.scp")})
    (1.5, None)
    """
    total, found = 0.0, False
    for path in outputs.values():
        if not str(path).endswith(".scp") or not Path(path).is_file():
            continue
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            _, _, value = line.partition(" ")
            if not value.endswith(".wav") or not Path(value).is_file():
                continue
            import soundfile

            info = soundfile.info(value)
            total += info.frames / info.samplerate
            found = True
    return round(total, 3) if found else None
