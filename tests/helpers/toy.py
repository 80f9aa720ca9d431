"""A toy recipe for tests: tiny dataset, a deterministic model, and logs of builds and forward calls.

Importable on Dask workers (tests/ is on sys.path via pytest's ``pythonpath``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from espnet3_prefect import InferenceProvider, InferenceRunner


def _append(path: str | None, line: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as handle:  # O_APPEND: whole small lines
            handle.write(line + "\n")


class ToyDataset:
    """Items ``{"utt_id", "x", "text"}``; ``bad`` maps index -> how the item is broken.

    Kinds: no_input, space_id, raise (reading fails), model_raise (the model fails on it),
    kill_once:<flag file> (SIGKILL its worker the first time), kill_always,
    fill:<file> (the first read writes <file> until its filesystem is full: put it on a small tmpfs;
    removing <file> frees the space),
    full:<flag file> (the first read creates <flag file>, and :class:`DiskFullRunner` then fails
    every write with ENOSPC until the flag is removed: a full disk where no tmpfs can be mounted;
    once, like fill).
    """

    def __init__(self, n: int, bad: dict | None = None, version_file: str | None = None):
        self.n, self.bad = n, {int(k): v for k, v in (bad or {}).items()}
        self.version_file = version_file

    def fingerprint(self) -> str | None:
        return Path(self.version_file).read_text() if self.version_file else None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> dict[str, Any]:
        item = {"utt_id": f"utt{idx:05d}", "x": idx, "text": f"t{idx}"}
        kind = self.bad.get(idx)
        if kind == "no_input":
            del item["x"]
        elif kind == "space_id":
            item["utt_id"] = f"utt {idx}"
        elif kind == "raise":
            raise RuntimeError(f"cannot read item {idx}")
        elif kind == "model_raise":
            item["x"] = "boom"
        elif kind == "kill_always" or (kind or "").startswith("kill_once:"):
            flag = Path(kind.split(":", 1)[1]) if ":" in kind else None
            if flag is None or not flag.exists():
                if flag is not None:
                    flag.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
        elif (kind or "").startswith("fill:"):
            fill_up(Path(kind.split(":", 1)[1]))
        elif (kind or "").startswith("full:"):
            flag = Path(kind.split(":", 1)[1])
            with contextlib.suppress(FileExistsError):  # once: a re-run after the flag was removed has room
                os.close(os.open(f"{flag}.once", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                flag.write_text(str(os.getpid()))
        return item


def fill_up(path: Path) -> None:
    """Write zeros to ``path`` until its filesystem has no space left; once (``<path>.once`` records it,
    so a re-run after ``path`` was removed finds room)."""
    import errno

    try:
        os.close(os.open(f"{path}.once", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    block = b"\0" * (1 << 16)
    try:
        while True:
            os.write(fd, block)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        try:  # the last partial page
            while True:
                os.write(fd, b"\0" * 512)
        except OSError:
            pass
    finally:
        os.close(fd)


class LengthsToyDataset(ToyDataset):
    """A toy dataset that tells each item's cost (``lengths()``, as a recipe's ``utt2dur`` would)."""

    def __init__(self, n: int, bad: dict | None = None, version_file: str | None = None, lengths=()):
        super().__init__(n, bad, version_file)
        self._lengths = list(lengths)

    def lengths(self):
        return self._lengths


class ToyOrganizer:
    def __init__(self, test=()):
        self.test = {
            t["name"]: (
                LengthsToyDataset(t["n"], t.get("bad"), t.get("version_file"), t["lengths"])
                if "lengths" in t
                else ToyDataset(t["n"], t.get("bad"), t.get("version_file"))
            )
            for t in test
        }


class ToyModel:
    """y = scale * x * x (+ offset); accepts one x or a list (batch)."""

    def __init__(self, scale: int = 1, offset: int = 0, sleep_s: float = 0.0, device: str = "cpu"):
        self.scale, self.offset, self.sleep_s = scale, offset, sleep_s

    def __call__(self, x: Any) -> Any:
        if isinstance(x, list):
            return [self(v) for v in x]
        if x == "boom":
            raise RuntimeError("model blew up")
        time.sleep(self.sleep_s)
        return self.scale * x * x + self.offset


class CountingProvider(InferenceProvider):
    """Logs ``build <pid>`` to ``config.toy.build_log`` each time an env is built."""

    def build_env_local(self):
        _append(self.config.get("toy", {}).get("build_log"), f"build {os.getpid()}")
        return super().build_env_local()

    def build_worker_setup_fn(self):
        return _CountingSetup(self.config.get("toy", {}).get("build_log"), super().build_worker_setup_fn())


class _CountingSetup:
    def __init__(self, log, setup):
        self.log, self.setup = log, setup

    def __call__(self):
        _append(self.log, f"build {os.getpid()}")
        return self.setup()


class CountingRunner(InferenceRunner):
    """Logs ``<pid> <idx>`` for every item forward() computes."""

    @staticmethod
    def forward(idx, forward_log=None, **env):
        for i in idx if isinstance(idx, list) else [idx]:
            _append(forward_log, f"{os.getpid()} {i}")
        return InferenceRunner.forward(idx, **env)


class BatchLogRunner(InferenceRunner):
    """Logs one line ``<idx> <idx> ...`` per forward() call (a batch's indices in the order given)."""

    @staticmethod
    def forward(idx, batch_log=None, **env):
        _append(batch_log, " ".join(map(str, idx if isinstance(idx, list) else [idx])))
        return InferenceRunner.forward(idx, **env)


class OwnMergeRunner(BatchLogRunner):
    """:class:`BatchLogRunner` with a recipe's own ``merge`` (``y.scp`` only, its shards' lines in shard
    order): a merge the driver cannot reorder, so ``runner.max_duration`` sorts within each shard."""

    def merge(self, shard_dirs):
        with open(Path(self.output_dir) / "y.scp", "w", encoding="utf-8") as out:
            for shard_dir in shard_dirs:
                out.write((Path(shard_dir) / "y.scp").read_text(encoding="utf-8"))


class DiskFullRunner(CountingRunner):
    """The toy runner whose output writes fail with ENOSPC while the file ``full_flag`` exists."""

    @staticmethod
    def write_record(writers, result, state, full_flag=None, **env):
        if full_flag and os.path.exists(full_flag):
            import errno

            target = Path(writers["shard_dir"]) / "y.scp"
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        return InferenceRunner.write_record(writers, result, state, **env)


def toy_output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [toy_output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "y": model_output, "ref": data["text"]}


def not_a_dict_output_fn(data, model_output, idx):
    return model_output


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _batch_job() -> str:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("JOB_ID") or os.environ.get("OAR_JOB_ID") or "-"


_RERUNNING: list[bool] = []  # set in a worker process once it re-computes an item (slow_once)


class JobRecordingRunner(InferenceRunner):
    """Like the toy runner, and logs ``<batch job id> <pid> <idx>`` after each item.

    Each item takes ``delay_s``; with ``slow_once``, a worker process that meets an item already
    computed (it is re-running an interrupted shard) is quick from then on.
    """

    @staticmethod
    def forward(idx, job_log=None, delay_s=0.0, slow_once=False, **env):
        out = InferenceRunner.forward(idx, **env)
        indices = idx if isinstance(idx, list) else [idx]
        if slow_once and job_log and not _RERUNNING:
            done_before = {line.split()[-1] for line in read_lines(Path(job_log))}
            if any(str(i) in done_before for i in indices):
                _RERUNNING.append(True)
        if delay_s and not _RERUNNING:
            import time

            time.sleep(float(delay_s))
        for i in indices:
            _append(job_log, f"{_batch_job()} {os.getpid()} {i}")
        return out


_GATE_DEADLINES: dict[str, float] = {}


class GatedRunner(InferenceRunner):
    """Like the toy runner, but items wait until the file ``gate`` exists (a process waits at most
    ``gate_timeout_s`` in all): a test inspects the running cluster, then opens the gate."""

    @staticmethod
    def forward(idx, gate=None, gate_timeout_s=180.0, **env):
        deadline = _GATE_DEADLINES.setdefault(str(gate), time.monotonic() + float(gate_timeout_s))
        while gate and not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.2)
        return InferenceRunner.forward(idx, **env)


class DatasetCountingProvider(CountingProvider):
    """Logs ``dataset <pid> <thread name>`` to ``config.toy.dataset_log`` each time a dataset is built:
    the driver's builds are the ones in the test's own process and main thread."""

    @staticmethod
    def build_dataset(config):
        import threading

        _append(config.get("toy", {}).get("dataset_log"), f"dataset {os.getpid()} {threading.current_thread().name}")
        return CountingProvider.build_dataset(config)


class SyntheticModuleProvider(DatasetCountingProvider):
    """Its dataset's class lives in a module loaded under a name workers cannot import
    (:mod:`tests.helpers.synthetic_dataset` as ``_e3p_synthetic_dataset``), as a recipe's local dataset
    does under ESPnet3 202611; each process that builds it loads that module itself."""

    @staticmethod
    def build_dataset(config):
        import importlib.util
        import sys
        from pathlib import Path

        name = "_e3p_synthetic_dataset"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("synthetic_dataset.py"))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        return sys.modules[name].Wrapped(DatasetCountingProvider.build_dataset(config))
