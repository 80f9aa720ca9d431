"""mini_an4's ``train`` placed on a GPU as one job (``placement: {train: {env: local}}``, Lightning on
``accelerator: gpu``), its earlier stages in the flow's process: which processes used the GPU (read
from ``nvidia-smi`` every 0.5 s while the recipe runs) and the stage table. For a machine with a GPU and
the real ESPnet 202611 (``egs3`` importable); the summary is one JSON line, and the files go to ``out``.

    .venv-espnet/bin/python -m benchmarks.gpu_placed_train /tmp/out
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from importlib.resources import as_file, files
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["create_dataset", "train_tokenizer", "collect_stats", "train"]


def copy_recipe(dest: Path) -> Path:
    with as_file(files("egs3")) as installed:
        for rel in ("mini_an4/esp2_asr", "TEMPLATE/esp2_asr"):
            shutil.copytree(Path(installed) / rel, dest / "egs3" / rel, ignore=shutil.ignore_patterns("__pycache__"))
        for rel in ("__init__.py", "mini_an4/__init__.py", "TEMPLATE/__init__.py"):
            if (Path(installed) / rel).is_file():
                shutil.copy2(Path(installed) / rel, dest / "egs3" / rel)
    return dest / "egs3" / "mini_an4" / "esp2_asr"


def gpu_training_config(recipe: Path, epochs: int) -> str:
    text = (recipe / "conf" / "training_asr_streaming.yaml").read_text()
    text = text.replace("  max_epochs: 1\n", f"  max_epochs: {epochs}\n  accelerator: gpu\n  devices: 1\n", 1)
    (recipe / "conf" / "training_gpu.yaml").write_text(text + "\nplacement:\n  train:\n    env: local\n")
    return "conf/training_gpu.yaml"


def gpu_processes(seen: dict[int, int], stop: threading.Event) -> None:
    """``{pid: most MiB seen}`` of the processes holding GPU memory, until ``stop``."""
    while not stop.wait(0.5):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.splitlines():
            pid, _, mib = line.partition(",")
            if pid.strip().isdigit():
                seen[int(pid)] = max(seen.get(int(pid), 0), int(mib.strip() or 0))


def main(out: Path, epochs: int = 3) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/e3p-gpu-placed")
    shutil.rmtree(work, ignore_errors=True)
    recipe = copy_recipe(work)
    config = gpu_training_config(recipe, epochs)
    egs3 = recipe.parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(egs3.parent), str(egs3 / "TEMPLATE" / "esp2_asr"), str(recipe), str(ROOT), env.get("PYTHONPATH", "")]
    )
    env["PATH"] = os.pathsep.join([str(ROOT / "tests" / "realespnet"), env.get("PATH", "")])  # sph2pipe
    env.update(ESPNET3_PREFECT_HOME=str(work / "home"), PYTHONUNBUFFERED="1")
    seen: dict[int, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=gpu_processes, args=(seen, stop), daemon=True)
    watcher.start()
    cmd = [sys.executable, "-m", "espnet3_prefect.cli", "run", "--stages", *STAGES, "--training_config", config]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=recipe, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said, _ = proc.communicate(timeout=540)
    wall_s = time.monotonic() - started
    stop.set()
    watcher.join()
    (out / "run.log").write_text(said)
    job = recipe / "exp" / "training_gpu" / ".stage-jobs" / "train"
    result = json.loads((job / "result.json").read_text()) if (job / "result.json").is_file() else {}
    if (job / "job.out").is_file():
        shutil.copy2(job / "job.out", out / "job.out")
    job_out = (job / "job.out").read_text() if (job / "job.out").is_file() else ""
    summary = {
        "rc": proc.returncode,
        "wall_s": round(wall_s, 1),
        "driver_pid": proc.pid,
        "job_pid": result.get("pid"),
        "job_state": result.get("state"),
        "job_s": round(result.get("ended_at", 0) - result.get("started_at", 0), 1) if result else None,
        "gpu_mib_by_pid": seen,
        "driver_used_gpu": proc.pid in seen,
        "job_used_gpu": result.get("pid") in seen,
        "lightning_gpu_line": next((ln.strip() for ln in job_out.splitlines() if "GPU available" in ln), None),
        "table": [ln for ln in said.splitlines() if ln.split(" ")[0] in ("stage", *STAGES)][-5:],
        "checkpoints": sorted(p.name for p in (recipe / "exp" / "training_gpu").glob("*.ckpt")),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/e3p-gpu-out"))
