"""Runner workloads for the run-runner flow tests, importable on Dask workers and batch jobs.

``SquareRunner`` writes ``<idx> <idx*idx>`` lines per shard and merges them into ``out.txt``,
returning the merged lines; its provider logs every env build and every forward call, and can
make an index fail (``fail_at``) or SIGKILL its worker once (``kill_once_at`` + ``flag``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from espnet3_prefect import BaseRunner, EnvironmentProvider


def _append(path, line: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


class LogProvider(EnvironmentProvider):
    """``config``: ``{"log": path, "fail_at": idx, "kill_once_at": idx, "flag": path, "offset": n}``."""

    def build_env_local(self):
        _append(self.config.get("log"), f"build {os.getpid()}")
        return {"cfg": dict(self.config)}


class LengthsProvider(LogProvider):
    """:class:`LogProvider` whose dataset (``build_dataset``, as an inference provider has) tells each item's
    length: ``config["lengths"]``."""

    @staticmethod
    def build_dataset(config):
        return _Lengths(config["lengths"])


class _Lengths:
    def __init__(self, values):
        self.values = list(values)

    def __len__(self):
        return len(self.values)

    def __getitem__(self, index):
        return {"utt_id": f"u{index}", "length": self.values[index]}

    def lengths(self):
        return self.values


class SquareRunner(BaseRunner):
    @staticmethod
    def forward(idx, cfg=None, **env):
        cfg = cfg or {}
        if isinstance(idx, list):
            _append(cfg.get("log"), "batch " + " ".join(map(str, idx)))
        out = []
        for i in idx if isinstance(idx, list) else [idx]:
            _append(cfg.get("log"), f"forward {os.getpid()} {i} {os.environ.get('SLURM_JOB_ID', '-')}")
            if i == cfg.get("fail_at"):
                raise ValueError(f"cannot square {i}")
            if i == cfg.get("kill_once_at") and not Path(cfg["flag"]).exists():
                Path(cfg["flag"]).write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            out.append((i, i * i + cfg.get("offset", 0)))
        return out if isinstance(idx, list) else out[0]

    @staticmethod
    def open_writers(shard_dir, **env):
        return {"out": open(Path(shard_dir) / "out.txt", "w", encoding="utf-8")}

    @staticmethod
    def write_record(writers, result, state, **env):
        for i, sq in result if isinstance(result, list) else [result]:
            writers["out"].write(f"{i} {sq}\n")

    def merge(self, shard_dirs):
        lines = [line for d in shard_dirs for line in (Path(d) / "out.txt").read_text().splitlines()]
        (Path(self.output_dir) / "out.txt").write_text("".join(f"{line}\n" for line in lines))
        return lines


def forward_calls(log: Path) -> list[int]:
    return [int(line.split()[2]) for line in read(log) if line.startswith("forward ")]


def forward_jobs(log: Path) -> set[str]:
    """The batch job ids forward() ran in (``-`` outside a SLURM job)."""
    return {line.split()[3] for line in read(log) if line.startswith("forward ")}


def batches(log: Path) -> list[list[int]]:
    """The batches forward() got, in call order (one process's calls in its order)."""
    return [list(map(int, line.split()[1:])) for line in read(log) if line.startswith("batch ")]


def builds(log: Path) -> list[str]:
    return [line for line in read(log) if line.startswith("build ")]


def read(path: Path) -> list[str]:
    return Path(path).read_text().splitlines() if Path(path).exists() else []
