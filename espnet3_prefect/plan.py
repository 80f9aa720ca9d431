"""Plan shards: contiguous, deterministic index ranges, independent of the backend.

The plan depends only on the number of items and ``num_shards`` (default below), not on
``n_workers`` up to 16 workers, so a run resumed with another worker count reuses every finished
shard. Shards are coarse on purpose: a Prefect task costs ~0.1 s on the flow side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Enough shards to balance load over up to 16 workers (2 per worker) and to keep a retry cheap;
# few enough that orchestration stays well under the work itself.
DEFAULT_MIN_SHARDS = 32
# Upper bound on items per shard, so 1M-item sets still get retry-sized shards.
MAX_ITEMS_PER_SHARD = 5000


@dataclass(frozen=True)
class Shard:
    """One unit of work: items ``start`` (inclusive) to ``stop`` (exclusive) of one test set."""

    test_set: str
    index: int
    start: int
    stop: int

    @property
    def n_items(self) -> int:
        return self.stop - self.start

    @property
    def dir_name(self) -> str:
        return f"split.{self.index}"

    def to_dict(self) -> dict:
        return asdict(self)


def default_num_shards(n_items: int, n_workers: int) -> int:
    """Shard count when ``parallel.num_shards`` is unset.

    >>> default_num_shards(100, 2), default_num_shards(10, 2), default_num_shards(1_000_000, 4)
    (32, 10, 200)
    """
    wanted = max(DEFAULT_MIN_SHARDS, 2 * n_workers, -(-n_items // MAX_ITEMS_PER_SHARD))
    return max(1, min(n_items, wanted))


def plan_shards(test_set: str, n_items: int, num_shards: int) -> list[Shard]:
    """Split ``range(n_items)`` into ``num_shards`` contiguous ranges whose sizes differ by <= 1.

    >>> [(s.start, s.stop) for s in plan_shards("t", 7, 3)]
    [(0, 3), (3, 5), (5, 7)]
    """
    if n_items <= 0:
        raise ValueError(f"test set {test_set!r}: cannot plan shards for {n_items} items")
    num_shards = max(1, min(num_shards, n_items))
    base, extra = divmod(n_items, num_shards)
    shards, start = [], 0
    for index in range(num_shards):
        stop = start + base + (1 if index < extra else 0)
        shards.append(Shard(test_set, index, start, stop))
        start = stop
    return shards
