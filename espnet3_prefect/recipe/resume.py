"""``train`` resumed: when the last ``train`` with the same inputs did not finish, the re-run continues
from its last checkpoint (Lightning's ``trainer.fit(ckpt_path=...)``) instead of step 0.

ESPnet3 202611's trainer saves a full checkpoint (weights, optimiser, scheduler, loop state) at the end
of each training epoch as ``<exp_dir>/step<N>.ckpt`` with ``last.ckpt`` a link to the newest; the
best-model checkpoints beside them hold weights only and cannot resume a loop. ``train`` calls
``trainer.fit(**training_config.fit)``, so a resume sets ``fit.ckpt_path`` for that call: a TEMPLATE
recipe (``fit: {}``) then resumes as ESPnet2's ``asr.sh --resume true`` did. A checkpoint older than
the interrupted run's start is another run's and is never used; ``--rerun train`` always starts fresh.

>>> import tempfile, time, os
>>> exp = Path(tempfile.mkdtemp()); started = time.time() - 60
>>> for n in (1, 2): _ = (exp / f"step{n}.ckpt").write_bytes(b"x")
>>> os.symlink("step2.ckpt", exp / "last.ckpt")
>>> last_checkpoint(exp, started).name, step_of(last_checkpoint(exp, started))
('step2.ckpt', 2)
>>> last_checkpoint(exp, time.time() + 60) is None
True
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

_STEP = re.compile(r"^step(\d+)\.ckpt$")


def step_of(path: Path) -> int | None:
    found = _STEP.match(path.name)
    return int(found.group(1)) if found else None


def last_checkpoint(exp_dir: Path, since: float) -> Path | None:
    """The newest full checkpoint in ``exp_dir`` written since ``since`` (the interrupted run's start):
    ``last.ckpt``'s target, else the ``step<N>.ckpt`` of the highest step; None when there is none."""
    last = exp_dir / "last.ckpt"
    candidates = []
    if last.exists():
        candidates.append(last.resolve())
    candidates += sorted((p for p in exp_dir.glob("step*.ckpt") if step_of(p) is not None), key=step_of, reverse=True)
    for path in candidates:
        if path.is_file() and path.stat().st_mtime >= since:
            return path
    return None


def resume_from(training_config: Any, checkpoint: Path) -> None:
    """Set ``fit.ckpt_path`` of the training config ESPnet3's ``train`` is about to read."""
    OmegaConf.update(training_config, "fit.ckpt_path", str(checkpoint), merge=True, force_add=True)


__all__ = ["last_checkpoint", "resume_from", "step_of"]
