"""A batch that does not fit in the accelerator's memory, with ``runner.max_duration`` on: split in halves
and retried on the same worker, down to one item; only a single item that does not fit fails, naming
its utterance. Said once per shard.

Only under batches by duration: there batch composition is ours already (and outputs reach the hooks in
dataset order whatever the batches), so halving a batch changes nothing the run promises. Without the
key a shard runs upstream's consecutive batches and an out-of-memory error fails it as upstream's
``infer()`` would (halving would change the batches silently, and with them the bytes of a model whose
decoding depends on padding).

What counts as out of memory: torch's ``OutOfMemoryError`` (``torch.OutOfMemoryError``, also named
``torch.cuda.OutOfMemoryError``), or a ``RuntimeError`` whose message says ``out of memory`` (what
older torch, cuDNN and cuBLAS raise), anywhere in the cause chain.

>>> is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")), is_out_of_memory(KeyError("x"))
(True, False)
>>> halves([4, 5, 6, 7, 8])
([4, 5, 6], [7, 8])
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is an accelerator's out-of-memory error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        torch = sys.modules.get("torch")  # never imported here: a runner that raises it has loaded it
        cuda = getattr(torch, "cuda", None)
        oom_class = getattr(torch, "OutOfMemoryError", None) or getattr(cuda, "OutOfMemoryError", None)
        if oom_class is not None and isinstance(exc, oom_class):
            return True
        if isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def halves(unit: list) -> tuple[list, list]:
    """The two halves of a batch (the first one the larger when the count is odd)."""
    middle = (len(unit) + 1) // 2
    return list(unit[:middle]), list(unit[middle:])


def free_cached_memory() -> None:
    """Give the memory torch's caching allocator holds back to the device, when torch and CUDA are loaded."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort: the retry itself says whether it fits
        pass


class Halving:
    """Per shard: whether halving is on, and the one line it says the first time it halves."""

    def __init__(self, shard_id: int, log: Callable[[str], Any] | None = None, enabled: bool = True):
        self.shard_id, self.log, self.enabled = shard_id, log, enabled
        self.count = 0
        #: the batches that ran to completion, in call order (what padding is measured on once one split)
        self.ran: list[list] = []

    def split(self, label: str, size: int, exc: BaseException) -> None:
        """Note one halving (of a batch of ``size`` items, ``label`` naming them); said once per shard."""
        self.count += 1
        free_cached_memory()
        if self.count == 1 and self.log is not None:
            first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            self.log(
                f"split.{self.shard_id}: a batch of {size} ({label}) ran out of memory ({first}); "
                f"splitting batches that do not fit in halves, down to one item (said once per shard)"
            )
