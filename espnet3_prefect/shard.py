"""Run shard: forward over one index range, written under a temporary name, published atomically."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

from .atomic import publish_dir
from .marker import shard_files
from .plan import Shard


FAILURES_NAME = "failures.jsonl"


def execute_shard(runner, env: dict, shard: Shard, out_dir: Path, on_error: str = "fail") -> dict:
    """Run ``runner`` over ``shard`` into ``out_dir/split.N``; return a small summary (no data).

    The shard is written into a hidden temporary folder and renamed into place when complete;
    the done marker is written afterwards by the mark-done step.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{shard.dir_name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    started = time.perf_counter()
    try:
        count, failures = runner.write_shard(tmp, range(shard.start, shard.stop), env,
                                             shard_id=shard.index, on_error=on_error)
        if failures:
            (tmp / FAILURES_NAME).write_text("".join(json.dumps(f, sort_keys=True) + "\n" for f in failures),
                                             encoding="utf-8")
        files = shard_files(tmp)
        publish_dir(tmp, out_dir / shard.dir_name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        **shard.to_dict(),
        "items": count,
        "failed": len(failures),
        "seconds": round(time.perf_counter() - started, 4),
        "files": files,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "sge_job_id": os.environ.get("JOB_ID"),
    }
