"""Batches by duration (``runner.max_duration``, opt-in): what ``forward`` gets, and the order its results
reach the runner's hooks and the merged files.

Without the key nothing here runs: a shard's ``forward`` calls are upstream's consecutive batches.
With it, items are sorted by length, longest first (ties: lower index first), and cut greedily into
batches whose padded size, the longest item's length times the item count, stays within
``max_duration``, with at most ``batch_size`` items; an item longer than the budget alone forms its
own batch. ``max_duration`` is in the units of the dataset's ``lengths()`` (seconds for durations,
samples for sample counts). What is sorted together depends on the runner (:func:`sorts_whole_test_set`):

- **The whole test set**, for a runner that writes and merges as ESPnet3's ``InferenceRunner`` does
  (one ``<utt_id> <value>`` line per item and field in ``split.N/<field>.scp``, concatenated by
  ``merge``): shards are runs of the whole set's batches (:func:`~.plan.plan_length_order`), each
  shard's lines are written batch by batch as they come (no result is held back), its done marker
  records which item each ``utt_id`` is, and the driver puts each merged ``.scp`` back in dataset
  order (:func:`~.merge.put_in_dataset_order`). Measured on 280 real utterances of 0.2-15 s
  (docs/benchmarks.md): padding efficiency 0.93 sorted whole against 0.76 sorted in each of 4 shards.
- **Each shard's items**, for any other runner (a recipe's own ``merge`` the driver cannot reorder):
  shards stay upstream's contiguous ranges and the results are handed to ``reduce_state`` /
  ``write_record`` in dataset order, grouped as upstream's consecutive batches (:class:`InOrder`), so
  every per-shard file, and so every merged file, has the lines and line order of the run without the
  key. This needs a ``forward`` that returns a list with one result per item for a batch (as
  ESPnet3's runners do); another result is refused on one line naming the runner class, never
  written out of order.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.espnet3.artifacts import check_utt_id

KEY = "max_duration"


def check_max_duration(value: Any, batch_size: int | None) -> float | None:
    """``runner.max_duration`` checked: None (off) or a number > 0, with a positive ``batch_size``.

    >>> check_max_duration(None, None), check_max_duration(30, 16)
    (None, 30.0)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ConfigError(
            f"runner.{KEY}: must be a number > 0 (the most padded length per batch, in the units of the "
            f"dataset's lengths(), e.g. seconds), got {value!r}"
        )
    if value == float("inf"):
        raise ConfigError(f"runner.{KEY}: must be a finite number > 0, got {value!r}")
    if batch_size is None:
        raise ConfigError(
            f"runner.{KEY}: needs batch_size (a positive integer, the most items per batch); "
            f"batch_size is null (one item per forward call)"
        )
    return float(value)


def caveat(max_duration: float, whole_test_set: bool = True) -> str:
    """The one line a run with the key says once.

    >>> caveat(30, whole_test_set=False)[:75]
    'runner.max_duration=30: batches are cut by length (sorted within each shard'
    """
    scope = (
        "sorted across the whole test set, merged files put back in dataset order"
        if whole_test_set
        else "sorted within each shard, as the runner's own merge() cannot be reordered; outputs kept in dataset order"
    )
    return (
        f"runner.{KEY}={max_duration:g}: batches are cut by length ({scope}), which changes batch "
        f"composition; a model whose decoding depends on padding can change transcripts "
        f"(ESPnet PR #6656: 79-87 of 100 identical at batch 4-16)"
    )


#: the hooks whose contract lets the driver reorder the merged files: one ``<utt_id> <value>`` line per
#: item and field, in ``split.N/<field>.scp`` files that ``merge`` concatenates
SCP_HOOKS = ("open_writers", "write_record", "close_writers", "merge")


def sorts_whole_test_set(runner_cls: type) -> bool:
    """Whether ``runner.max_duration`` sorts the whole test set for ``runner_cls``: every one of its
    :data:`SCP_HOOKS` is ESPnet3 202611's ``InferenceRunner``'s or ours (a subclass may override
    ``forward`` and the rest), so each merged ``.scp`` can be put back in dataset order by ``utt_id``.

    >>> from espnet3_prefect.espnet3.inference_runner import InferenceRunner
    >>> class Mine(InferenceRunner):
    ...     def merge(self, shard_dirs): ...
    >>> sorts_whole_test_set(InferenceRunner), sorts_whole_test_set(Mine)
    (True, False)
    """
    return any(all(getattr(runner_cls, h, None) is getattr(base, h) for h in SCP_HOOKS) for base in _scp_runners())


def _scp_runners() -> list[type]:
    """Our ``InferenceRunner`` and, when a recipe's runner has imported it, ESPnet3's."""
    from espnet3_prefect.espnet3.inference_runner import InferenceRunner

    upstream = getattr(sys.modules.get("espnet3.systems.base.inference_runner"), "InferenceRunner", None)
    return [InferenceRunner] + ([upstream] if isinstance(upstream, type) else [])


def duration_batches(
    indices: Sequence[int], lengths: Sequence[float], max_duration: float, batch_size: int
) -> list[list[int]]:
    """``indices`` (with ``lengths[k]`` the length of ``indices[k]``) sorted longest first and cut so
    that longest x count <= ``max_duration`` and count <= ``batch_size``; an item longer than the
    budget is a batch of its own. Deterministic: ties keep the lower index first.

    >>> duration_batches(range(10, 16), [1, 5, 2, 2, 9, 1], 6, 3)
    [[14], [11], [12, 13, 10], [15]]
    """
    order = sorted(range(len(indices)), key=lambda k: (-float(lengths[k]), k))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0.0
    for k in order:
        length = float(lengths[k])
        if current and (len(current) >= batch_size or max(longest, length) * (len(current) + 1) > max_duration):
            batches.append(current)
            current, longest = [], 0.0
        current.append(int(indices[k]))
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def padded_length(lengths: Sequence[float]) -> float:
    """What a batch costs padded: its longest item's length times its item count (0 for no items).

    >>> padded_length([1.0, 3.0, 2.0]), padded_length([])
    (9.0, 0.0)
    """
    return float(max(lengths, default=0.0)) * len(lengths)


def padding(units: Sequence[Any], length_of: dict[int, float]) -> dict[str, Any]:
    """``{"batches", "real", "padded"}``: the summed real lengths and padded lengths
    (:func:`padded_length`) of ``units``; ``real / padded`` is the padding efficiency.

    >>> padding([[0, 1], [2]], {0: 1.0, 1: 3.0, 2: 2.0})
    {'batches': 2, 'real': 6.0, 'padded': 8.0}
    """
    real = padded = 0.0
    for unit in units:
        items = unit if isinstance(unit, list) else [unit]
        values = [length_of[i] for i in items]
        real += sum(values)
        padded += padded_length(values)
    return {"batches": len(units), "real": round(real, 6), "padded": round(padded, 6)}


class InOrder:
    """Results of ``forward`` calls made in any order, handed on in the order of ``groups`` (upstream's
    consecutive batches, or in length order the batches themselves): a group goes as soon as each of
    its items has a result or failed; a complete group as the list ``forward`` would have returned for
    it, a group with a failed item item by item (as ``on_error: skip`` hands them on without the key).

    ``keys`` (a list, with ``idx_key``): filled with ``[index, utt_id]`` for each result handed on, the
    ``utt_id`` as it heads the result's SCP lines; what the merge reorders the lines by."""

    def __init__(self, groups: Sequence[Any], runner_name: str, keys: list | None = None, idx_key: str = "utt_id"):
        self.groups = [g if isinstance(g, list) else [g] for g in groups]
        self.runner_name = runner_name
        self.next = 0
        self.results: dict[int, Any] = {}
        self.failed: set[int] = set()
        self.keys, self.idx_key = keys, idx_key

    def add(self, unit: Any, result: Any) -> None:
        """``result``: what ``forward`` returned for ``unit`` (a list of indices)."""
        items = unit if isinstance(unit, list) else [unit]
        if not isinstance(result, list) or len(result) != len(items):
            got = f"a list of {len(result)}" if isinstance(result, list) else type(result).__name__
            raise ConfigError(
                f"runner.{KEY}: {self.runner_name}.forward returned {got} for a batch of {len(items)} items; "
                f"batches by duration need one result per item to write them in dataset order (drop the key)"
            )
        for index, one in zip(items, result):
            self.results[index] = one

    def fail(self, index: int) -> None:
        self.failed.add(index)

    def ready(self) -> Iterator[list]:
        """The results that can go now, in order: each what one ``reduce_state`` call gets."""
        while self.next < len(self.groups):
            group = self.groups[self.next]
            if any(i not in self.results and i not in self.failed for i in group):
                return
            self.next += 1
            if not any(i in self.failed for i in group):
                yield [self._handed(i) for i in group]
                continue
            for i in group:
                if i in self.failed:
                    self.failed.discard(i)
                else:
                    yield [self._handed(i)]

    def _handed(self, index: int) -> Any:
        result = self.results.pop(index)
        if self.keys is not None and isinstance(result, Mapping) and self.idx_key in result:
            try:
                self.keys.append([index, check_utt_id(result[self.idx_key])])
            except ValueError:
                pass  # write_record refuses it, naming the utterance
        return result

    @property
    def finished(self) -> bool:
        return self.next == len(self.groups)
