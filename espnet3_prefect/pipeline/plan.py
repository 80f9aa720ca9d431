"""Plan shards: batches are formed first (as ESPnet3 does), then cut into contiguous shards.

A *unit* is what one ``forward`` call gets: an index (``batch_size`` null) or a list of up to
``batch_size`` consecutive indices. Shards are contiguous runs of units, so every model call sees
exactly the batch upstream ``infer()`` would give it, whatever the shard count. The shard count
depends only on the item count and ``num_shards`` (default below), not on ``n_workers`` up to 16
workers, so a run resumed with another worker count reuses every finished shard. Shards are coarse
on purpose: a Prefect task costs milliseconds to tens of milliseconds on the flow side.

When the dataset tells each item's cost (an optional ``lengths()``: durations, sample counts, one
non-negative number per item), the boundaries are chosen on cumulative length instead of unit
counts (:func:`balanced_cuts`): still contiguous, on batch boundaries, the same count, and the
same plan for the same lengths; the lengths' fingerprint joins the stage identity, so changed
lengths re-plan.

With ``runner.max_duration`` (:mod:`espnet3_prefect.pipeline.duration`) there are two plans:

- **length order** (:func:`plan_length_order`; for a runner whose ``merge`` concatenates SCP files,
  as ESPnet3's ``InferenceRunner`` does, see :func:`~.duration.sorts_whole_test_set`): the whole test
  set is sorted longest first and cut into batches on the budget, and the shards are runs of those
  batches (``Shard.length_order``: ``indices`` holds the items in that order, ``start``/``stop`` are
  positions in it). A shard's batches are the ones the whole set would have, so the padding is that
  of the whole set sorted; the driver puts the merged files back in dataset order.
- **within each shard** (any other runner): the shards are the same contiguous ranges, cut the same
  way; only what each ``forward`` call gets changes (:meth:`Shard.forward_units`: the shard's items
  sorted by length and cut on the budget), while :meth:`Shard.units` stays upstream's consecutive
  batches: the grouping the results are handed to the hooks in, so every file is in dataset order
  whatever the runner's ``merge`` does.

``manifest.json`` lists :meth:`Shard.units`: upstream ``infer()`` resuming such a folder finds a plan
other than its own and refuses (its "shard plan changed"), or, within each shard, runs its own batches
and writes its lines in order.

With ``parallel.shard_duration`` (opt-in) the shard *count* comes from the lengths instead:
``ceil(total length / shard_duration)`` shards, cut by :func:`balanced_cuts` as above (so still
contiguous ranges on batch boundaries, merged in shard order as before), each about
``shard_duration`` long; many more shards than workers for a test set much longer than a shard.
The count never exceeds the flow run's cap (:data:`MAX_SHARD_TASKS_PER_FLOW`, shared by the run's
test sets): a target that would give more shards is met by merging neighbouring pieces, i.e. fewer,
longer shards. The flows hand such shards out longest first (:func:`longest_first`: by padded length,
what a model's cost grows with), so the shard holding the longest utterances starts first and the
last ones to start are the cheapest; Dask gives each to the next worker that frees up.

The plan is persisted in upstream's ``manifest.json`` schema (:func:`write_manifest`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from espnet3_prefect._internal.atomic import atomic_open

# Enough shards to balance load over up to 16 workers (2 per worker) and to keep a retry cheap.
DEFAULT_MIN_SHARDS = 32
# Upper bound on items per shard, so 1M-item sets still get retry-sized shards.
MAX_ITEMS_PER_SHARD = 5000
MANIFEST_VERSION = 1
#: The most ``run-shard`` task runs one flow run plans with ``parallel.shard_duration`` (all its test
#: sets together). Prefect's server gets unstable at a few thousand task runs per flow run
#: (PrefectHQ/prefect #18883) and spends 30-60 ms of CPU on each (docs/benchmarks.md, "server CPU per
#: task run"): 1,000 keeps a run's record under a minute of server CPU and well below that range, while
#: giving 2 workers 500 shards each and 64 workers 15 each.
MAX_SHARD_TASKS_PER_FLOW = 1000

Unit = int | list


@dataclass(frozen=True)
class Shard:
    """One unit of work: items ``start`` (inclusive) to ``stop`` (exclusive) of one test set,
    processed as ``forward`` units of ``batch_size`` items (None: one item per call)."""

    test_set: str
    index: int
    start: int
    stop: int
    batch_size: int | None = None
    #: the shard's own dataset indices when the run is over an explicit index list (``runner(indices)``);
    #: None when the items are ``range(start, stop)`` of the dataset (the infer stage)
    indices: tuple | None = None
    #: the items' lengths (``lengths()`` of :meth:`items`, in order) as float64 little-endian bytes, when
    #: the dataset has them: the shard's padding is measured on them (bytes: cheap to ship and to search);
    #: not part of the plan's equality (the plan is the ranges and batches)
    lengths: bytes | None = field(default=None, compare=False, repr=False)
    #: ``runner.max_duration``: ``forward`` gets batches cut by length (None: upstream's batches)
    max_duration: float | None = None
    #: the items are a run of the whole test set sorted longest first (:func:`plan_length_order`):
    #: ``indices`` in that order, ``start``/``stop`` positions in it; results reach the hooks batch by
    #: batch as they run, and the merge puts the lines back in dataset order
    length_order: bool = False

    @property
    def n_items(self) -> int:
        return self.stop - self.start

    def items(self) -> Sequence[int]:
        """The shard's dataset indices, in its order.

        >>> list(Shard("t", 0, 4, 7).items()), Shard("t", 0, 0, 2, indices=(9, 3)).items()
        ([4, 5, 6], (9, 3))
        """
        return self.indices if self.indices is not None else range(self.start, self.stop)

    def units(self) -> Iterator[Unit]:
        """The batches the results are handed to the hooks in (and ``manifest.json`` lists): upstream's
        consecutive batches, or in length order the batches ``forward`` gets.

        >>> list(Shard("t", 0, 4, 9, batch_size=2).units())
        [[4, 5], [6, 7], [8]]
        """
        if self.length_order:
            yield from self.forward_units()
            return
        items = self.items()
        if self.batch_size is None:
            yield from items
            return
        for first in range(0, len(items), self.batch_size):
            yield list(items[first : first + self.batch_size])

    def forward_units(self) -> list[Unit]:
        """What each ``forward`` call gets, in call order: :meth:`units`, or with ``max_duration`` the
        shard's items sorted longest first and cut on the budget (:func:`~.duration.duration_batches`).

        >>> import numpy as np
        >>> lengths = np.array([1, 5, 2, 2, 9, 1], dtype="<f8").tobytes()
        >>> Shard("t", 0, 10, 16, 3, lengths=lengths, max_duration=6.0).forward_units()
        [[14], [11], [12, 13, 10], [15]]
        """
        if self.max_duration is None:
            return list(self.units())
        from espnet3_prefect.pipeline.duration import duration_batches

        return duration_batches(self.items(), self.item_lengths(), self.max_duration, self.batch_size)

    def item_lengths(self) -> list[float] | None:
        """The lengths of :meth:`items`, in that order, or None when the dataset has none."""
        if self.lengths is None:
            return None
        import numpy as np

        return np.frombuffer(self.lengths, dtype="<f8").tolist()

    def to_dict(self) -> dict:
        return asdict(self)


def n_units(n_items: int, batch_size: int | None) -> int:
    return n_items if batch_size is None else -(-n_items // batch_size)


def default_num_shards(n_items: int, n_workers: int, batch_size: int | None = None) -> int:
    """Shard count when ``parallel.num_shards`` is unset (at most one shard per unit).

    >>> default_num_shards(100, 2), default_num_shards(10, 2), default_num_shards(1_000_000, 4)
    (32, 10, 200)
    >>> default_num_shards(13, 1, batch_size=4)
    4
    """
    wanted = max(DEFAULT_MIN_SHARDS, 2 * n_workers, -(-n_items // MAX_ITEMS_PER_SHARD))
    return max(1, min(n_units(n_items, batch_size), wanted))


def duration_shard_count(
    lengths: Sequence[float], batch_size: int | None, shard_duration: float, max_shards: int
) -> int:
    """How many shards of about ``shard_duration`` total length each: ``ceil(total / shard_duration)``,
    at least 1, at most one per unit and at most ``max_shards``.

    >>> duration_shard_count([3.0] * 10, None, 7.5, 1000), duration_shard_count([3.0] * 10, 4, 1, 1000)
    (4, 3)
    >>> duration_shard_count([3.0] * 10, None, 1, 6), duration_shard_count([0.0] * 10, None, 1, 6)
    (6, 1)
    """
    import math

    total = float(sum(float(x) for x in lengths)) if not hasattr(lengths, "sum") else float(lengths.sum())
    wanted = math.ceil(total / shard_duration) if total > 0 else 1
    return max(1, min(wanted, n_units(len(lengths), batch_size), max_shards))


def shard_cost(shard: Shard) -> float:
    """What a shard is expected to cost: the padded length of its ``forward`` calls (the longest item
    of each batch times its item count; the real length with one item per call), or its item count
    when it carries no lengths.

    >>> import numpy as np
    >>> shard_cost(Shard("t", 0, 0, 4, 2, lengths=np.array([1, 3, 2, 2], dtype="<f8").tobytes()))
    10.0
    >>> shard_cost(Shard("t", 0, 0, 4))
    4.0
    """
    from espnet3_prefect.pipeline.duration import padded_length

    values = shard.item_lengths()
    if values is None:
        return float(shard.n_items)
    length_of = dict(zip(shard.items(), values))
    total = 0.0
    for unit in shard.forward_units():
        total += padded_length([length_of[i] for i in (unit if isinstance(unit, list) else [unit])])
    return total


def longest_first(shards: Sequence[Shard]) -> list[Shard]:
    """``shards`` in the order they are handed out with ``parallel.shard_duration``: highest
    :func:`shard_cost` first, ties in shard order.

    >>> import numpy as np
    >>> f8 = lambda *v: np.array(v, dtype="<f8").tobytes()
    >>> shards = [Shard("t", 0, 0, 2, lengths=f8(1, 1)), Shard("t", 1, 2, 3, lengths=f8(5)),
    ...           Shard("t", 2, 3, 4, lengths=f8(3))]
    >>> [s.index for s in longest_first(shards)]
    [1, 2, 0]
    """
    costs = {s.index: shard_cost(s) for s in shards}
    return sorted(shards, key=lambda s: (-costs[s.index], s.index))


def plan_shards(
    test_set: str,
    n_items: int,
    num_shards: int,
    batch_size: int | None = None,
    indices=None,
    lengths: Sequence[float] | None = None,
    max_duration: float | None = None,
) -> list[Shard]:
    """Split the units of ``range(n_items)`` (or of the explicit ``indices`` list, positions
    ``0..n_items``) into ``num_shards`` contiguous runs; boundaries fall on batch boundaries.

    Without ``lengths`` the runs' unit counts differ by at most one. With ``lengths`` (one
    non-negative number per item, checked by the caller) the runs have about equal total length
    (:func:`balanced_cuts`); all-zero lengths plan as if there were none. ``lengths[k]`` is the length
    of position ``k`` (of ``indices[k]`` for an index list), and each shard carries its items' lengths;
    ``max_duration`` (which needs ``lengths`` and a ``batch_size``) changes only what its ``forward``
    calls get (:meth:`Shard.forward_units`).

    >>> [(s.start, s.stop) for s in plan_shards("t", 7, 3)]
    [(0, 3), (3, 5), (5, 7)]
    >>> [(s.start, s.stop) for s in plan_shards("t", 13, 2, batch_size=4)]
    [(0, 8), (8, 13)]
    >>> [(s.start, s.stop) for s in plan_shards("t", 6, 2, lengths=[1, 1, 1, 1, 1, 5])]
    [(0, 5), (5, 6)]
    """
    if n_items <= 0:
        raise ValueError(f"test set {test_set!r}: cannot plan shards for {n_items} items")
    if max_duration is not None and (lengths is None or batch_size is None):
        raise ValueError(f"test set {test_set!r}: max_duration needs lengths and a batch_size")
    units = n_units(n_items, batch_size)
    num_shards = max(1, min(num_shards, units))
    step = batch_size or 1
    cuts = balanced_cuts(unit_costs(lengths, n_items, step), num_shards) if lengths is not None else None
    cuts = cuts or even_cuts(units, num_shards)
    shards = []
    values = None if lengths is None else _as_float64(lengths)
    for index in range(num_shards):
        start, stop = cuts[index] * step, min(cuts[index + 1] * step, n_items)
        own = None if indices is None else tuple(int(i) for i in indices[start:stop])
        own_lengths = None if values is None else values[start:stop].tobytes()
        shards.append(Shard(test_set, index, start, stop, batch_size, own, own_lengths, max_duration))
    return shards


def plan_length_order(
    test_set: str, lengths: Sequence[float], num_shards: int, batch_size: int, max_duration: float
) -> list[Shard]:
    """Shards of the whole test set sorted longest first (ties: lower index first), cut into batches
    on ``max_duration`` and ``batch_size`` (:func:`~.duration.duration_batches`), then into at most
    ``num_shards`` runs of whole batches of about equal padded length (:func:`balanced_cuts`; equal
    batch counts when every length is zero). The same lengths always give the same plan. Each shard's
    :meth:`Shard.forward_units` are exactly its run of the whole set's batches.

    >>> shards = plan_length_order("t", [1, 5, 2, 2, 9, 1], 2, 3, 6.0)
    >>> [(s.start, s.stop, s.indices) for s in shards]
    [(0, 1, (4,)), (1, 6, (1, 2, 3, 0, 5))]
    >>> [s.forward_units() for s in shards]
    [[[4]], [[1], [2, 3, 0], [5]]]
    """
    from espnet3_prefect.pipeline.duration import duration_batches, padded_length

    values = _as_float64(lengths)
    n_items = len(values)
    if n_items <= 0:
        raise ValueError(f"test set {test_set!r}: cannot plan shards for {n_items} items")
    batches = duration_batches(range(n_items), values, max_duration, batch_size)
    num_shards = max(1, min(num_shards, len(batches)))
    costs = [padded_length(values[b]) for b in batches]
    cuts = balanced_cuts(costs, num_shards) or even_cuts(len(batches), num_shards)
    shards, position = [], 0
    for index in range(num_shards):
        own = tuple(i for batch in batches[cuts[index] : cuts[index + 1]] for i in batch)
        own_lengths = values[list(own)].tobytes()
        stop = position + len(own)
        shards.append(Shard(test_set, index, position, stop, batch_size, own, own_lengths, max_duration, True))
        position += len(own)
    return shards


def _as_float64(lengths: Sequence[float]):
    """The lengths as one little-endian float64 array (no copy for the checked array sizing gives)."""
    import numpy as np

    return np.ascontiguousarray(np.asarray(lengths, dtype=np.float64), dtype="<f8")


def unit_costs(lengths: Sequence[float], n_items: int, step: int):
    """The total length of each unit (``step`` consecutive items), as float64.

    >>> unit_costs([1, 2, 3, 4, 5], 5, 2).tolist()
    [3.0, 7.0, 5.0]
    """
    import numpy as np

    values = np.asarray(lengths, dtype=np.float64)[:n_items]
    return np.add.reduceat(values, np.arange(0, n_items, step)) if step > 1 else values


def even_cuts(units: int, num_shards: int) -> list[int]:
    """Unit boundaries ``[0, c1, ..., units]`` splitting ``units`` into ``num_shards`` runs whose counts
    differ by at most one, the longer ones first.

    >>> even_cuts(7, 3), even_cuts(4, 4)
    ([0, 3, 5, 7], [0, 1, 2, 3, 4])
    """
    base, extra = divmod(units, num_shards)
    cuts = [0]
    for index in range(num_shards):
        cuts.append(cuts[-1] + base + (1 if index < extra else 0))
    return cuts


def balanced_cuts(costs, num_shards: int) -> list[int] | None:
    """Unit boundaries ``[0, c1, ..., len(costs)]`` splitting ``costs`` into ``num_shards`` contiguous,
    non-empty runs whose totals are close to ``total / num_shards``: cut ``k`` goes where the
    cumulative cost is nearest to ``k * total / num_shards`` (the lower cut on a tie). Pure float64
    arithmetic in a fixed order, so the same costs always give the same cuts. None when every cost
    is zero (nothing to balance on).

    >>> balanced_cuts([1, 1, 1, 1, 4], 2), balanced_cuts([4, 1, 1, 1, 1], 2), balanced_cuts([0, 0], 2)
    ([0, 4, 5], [0, 1, 5], None)
    """
    import numpy as np

    cumulative = np.cumsum(np.asarray(costs, dtype=np.float64))
    units = len(cumulative)
    total = float(cumulative[-1]) if units else 0.0
    if total <= 0:
        return None
    cuts = [0]
    for k in range(1, num_shards):
        target = total * k / num_shards
        after = int(np.searchsorted(cumulative, target, side="left"))  # first unit reaching the target
        cut = after + 1  # cut after that unit ...
        if after > 0 and target - cumulative[after - 1] <= cumulative[after] - target:
            cut = after  # ... or before it, when that is at least as close
        cuts.append(min(max(cut, cuts[-1] + 1), units - (num_shards - k)))
    cuts.append(units)
    return cuts


def write_manifest(path: Path, output_dir: str, shard_subdir: str, shards: list[Shard]) -> None:
    """Write ``manifest.json`` in ESPnet3 202611's schema, so upstream ``infer()`` on this folder
    resumes exactly this plan or refuses with its own error (never merges a part of it).

    The JSON is streamed (a 1M-item plan is never held as lists), byte for byte what
    ``json.dump(data, f, ensure_ascii=False, indent=2)`` writes for the same plan.
    """
    with atomic_open(path, "w") as out:
        out.write(
            f'{{\n  "version": {MANIFEST_VERSION},\n  "output_dir": {_dumps(output_dir)},\n'
            f'  "shard_subdir": {_dumps(shard_subdir)},\n  "shards": ['
        )
        for position, shard in enumerate(shards):
            out.write(",\n    {\n" if position else "\n    {\n")
            out.write(f'      "shard_id": {shard.index},\n      "items": ')
            _write_units(out, shard)
            out.write("\n    }")
        out.write("\n  ]\n}" if shards else "]\n}")


def _write_units(out: IO[str], shard: Shard) -> None:
    units = shard.units()
    first = next(units, None)
    if first is None:
        out.write("[]")
        return
    out.write("[")
    _write_unit(out, first, leading="\n        ")
    for unit in units:
        _write_unit(out, unit, leading=",\n        ")
    out.write("\n      ]")


def _write_unit(out: IO[str], unit: Unit, leading: str) -> None:
    out.write(leading)
    if isinstance(unit, int):
        out.write(str(unit))
        return
    out.write("[\n          " + ",\n          ".join(map(str, unit)) + "\n        ]" if unit else "[]")


def _dumps(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
