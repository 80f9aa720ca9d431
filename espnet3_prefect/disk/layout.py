"""The on-disk layout of a stage: every file name we read or write, built and parsed here only.

ESPnet3 202611's names are kept so a folder can be shared with upstream ``infer()``::

    <inference_dir>/                      .espnet3-prefect.lock (one run at a time),
                                          .dask-jobs/<job name>/ (batch job logs)
    <inference_dir>/<test>/               output_dir: merged <field>.scp, failures.jsonl, .merged.json,
                                          .throughput.json (RTFx, items/s, padding: ours only)
    <inference_dir>/.lengths-cache/<test>.npz  item lengths read from audio headers (cache)
    <output_dir>/[<shard_subdir>/]        shards root: manifest.json (upstream's plan schema)
        split.N/                          one shard, written in place by the runner's hooks
        split.N/lock                      held while the shard runs (O_EXCL, pid on the first line)
        split.N/done                      written last: the commit point (our JSON + checksums)

A runner run outside the infer stage (:class:`RunnerLayout`) keeps the run lock and the job logs in
its shards root instead of the folder above.

>>> lay = StageLayout(Path("/x/inference/test_a"), "sub")
>>> lay.shard_dir(3).as_posix(), lay.manifest.as_posix()
('/x/inference/test_a/sub/split.3', '/x/inference/test_a/sub/manifest.json')
>>> shard_index("split.12"), shard_index("split.x"), shard_index("notes")
(12, None, None)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePath

SPLIT_PREFIX = "split."
DONE_NAME = "done"
SHARD_LOCK_NAME = "lock"
MANIFEST_NAME = "manifest.json"
FAILURES_NAME = "failures.jsonl"
MERGED_RECORD_NAME = ".merged.json"
RUN_LOCK_NAME = ".espnet3-prefect.lock"
#: beside the run lock: a run that ended because its Prefect server stayed away, and what it left unreported
UNREPORTED_NAME = ".espnet3-prefect.unreported.json"
JOB_LOGS_DIR_NAME = ".dask-jobs"
#: in inference_dir: each test set's item lengths read from its audio headers (espnet3_prefect.pipeline.lengths)
LENGTHS_CACHE_DIR_NAME = ".lengths-cache"
#: beside the merged outputs of a test set: its throughput (RTFx, items/s, padding), never read by upstream
THROUGHPUT_NAME = ".throughput.json"
#: beside metrics.json in inference_dir: what it was computed from (espnet3_prefect.metrics.record)
METRICS_RECORD_NAME = ".metrics.record.json"
#: beside evaluate_history.jsonl in inference_dir: the trend across checkpoints (espnet3_prefect.checkpoints.trend)
CHECKPOINT_PLOT_NAME = "evaluate_checkpoints.png"
#: in the watched experiment folder: the checkpoint hashes already sent (espnet3_prefect.checkpoints.events)
CHECKPOINT_STATE_NAME = ".espnet3-checkpoints.json"
#: files of a shard folder that are bookkeeping, not the runner's output (never checksummed)
SHARD_BOOKKEEPING = (DONE_NAME, SHARD_LOCK_NAME)


def shard_name(index: int) -> str:
    return f"{SPLIT_PREFIX}{index}"


def shard_index(name: str) -> int | None:
    """``N`` for a folder named ``split.N``, else None."""
    if not name.startswith(SPLIT_PREFIX):
        return None
    tail = name[len(SPLIT_PREFIX) :]
    return int(tail) if tail.isdigit() else None


def shards_root(output_dir: str | Path, shard_subdir: str = "") -> Path:
    root = Path(output_dir)
    return root / shard_subdir if shard_subdir else root


def shard_dir_path(output_dir: str | Path, shard_subdir: str, index: int) -> ShardPath:
    """``output_dir/[shard_subdir]/split.N`` (what upstream's hooks see as ``shard_dir``)."""
    return ShardPath(shards_root(output_dir, shard_subdir) / shard_name(index))


class ShardPath(type(Path())):  # type: ignore[misc]
    """A shard folder path that sorts by shard number, so ``sorted(shard_dirs)`` in a recipe's
    ``merge`` keeps dataset order past ``split.9`` (plain paths sort ``split.10`` before ``split.2``).

    >>> [p.name for p in sorted([ShardPath("/o/split.10"), ShardPath("/o/split.2")])]
    ['split.2', 'split.10']
    """

    def _sort_key(self):
        index = shard_index(self.name)
        return (str(self.parent), -1 if index is None else index, self.name)

    def __lt__(self, other):
        if isinstance(other, ShardPath):
            return self._sort_key() < other._sort_key()
        return PurePath.__lt__(self, other)

    def __gt__(self, other):
        if isinstance(other, ShardPath):
            return self._sort_key() > other._sort_key()
        return PurePath.__gt__(self, other)

    def __le__(self, other):
        return self == other or self < other

    def __ge__(self, other):
        return self == other or self > other


@dataclass(frozen=True)
class StageLayout:
    """The folders and files of one test set's stage (``output_dir`` = ``<inference_dir>/<test>``)."""

    output_dir: Path
    shard_subdir: str = ""

    @property
    def root(self) -> Path:
        """Where the shards and ``manifest.json`` live (``output_dir/[shard_subdir]``)."""
        return shards_root(self.output_dir, self.shard_subdir)

    def shard_dir(self, index: int) -> ShardPath:
        return shard_dir_path(self.output_dir, self.shard_subdir, index)

    def done(self, index: int) -> Path:
        return self.shard_dir(index) / DONE_NAME

    def shard_lock(self, index: int) -> Path:
        return self.shard_dir(index) / SHARD_LOCK_NAME

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_NAME

    @property
    def failures(self) -> Path:
        return self.output_dir / FAILURES_NAME

    @property
    def merged_record(self) -> Path:
        return self.output_dir / MERGED_RECORD_NAME

    @property
    def inference_dir(self) -> Path:
        return self.output_dir.parent

    @property
    def run_lock_dir(self) -> Path:
        return self.inference_dir

    @property
    def lengths_cache(self) -> Path:
        """The test set's item lengths read from audio headers, keyed inside by the files' fingerprint."""
        return self.inference_dir / LENGTHS_CACHE_DIR_NAME / f"{self.output_dir.name}.npz"

    @property
    def throughput(self) -> Path:
        """The test set's throughput of the last run that ran shards (machine-readable; upstream never reads it)."""
        return self.output_dir / THROUGHPUT_NAME

    def existing_shards(self) -> dict[int, Path]:
        """The ``split.N`` folders present under :attr:`root`, by N."""
        if not self.root.is_dir():
            return {}
        found = {}
        for path in self.root.iterdir():
            index = shard_index(path.name)
            if index is not None and path.is_dir():
                found[index] = path
        return found


@dataclass(frozen=True)
class RunnerLayout(StageLayout):
    """A runner's own folder (``runner(indices)`` / :func:`espnet3_prefect.run`): like a stage's, except
    that the run lock and ``.dask-jobs/`` live in the shards root itself, since the folder above
    ``output_dir`` belongs to the user::

        <output_dir>/[<shard_subdir>/]    manifest.json, split.N/, .espnet3-prefect.lock, .dask-jobs/

    >>> lay = RunnerLayout(Path("/x/stats"), "")
    >>> lay.run_lock_dir.as_posix(), job_logs_dir(lay.inference_dir, "e3p-1").as_posix()
    ('/x/stats', '/x/stats/.dask-jobs/e3p-1')
    """

    @property
    def inference_dir(self) -> Path:
        return self.root


def job_logs_dir(inference_dir: Path, job_name: str) -> Path:
    return inference_dir / JOB_LOGS_DIR_NAME / job_name
