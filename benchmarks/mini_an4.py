"""ESPnet's own mini_an4 recipe (real ESPnet 202611, a one-step model): ``infer`` + ``measure`` on 2
Dask workers, upstream's ``python run.py`` against ours (``espnet3-prefect run``), same flags; and
``collect_stats`` on 2 workers (``conf/training_asr_streaming_parallel.yaml``, the mini_an4 tests'), the same way.

Needs the real-ESPnet layer: ``.venv-espnet`` (``bash scripts/real_espnet_setup.sh``) and a recipe
folder the mini_an4 tests trained (``E3P_REALESPNET_WORKDIR=<folder> .venv-espnet/bin/python -m pytest
-m realespnet tests/realespnet/test_mini_an4.py``, which keeps it there). Both sides run in
``.venv-espnet`` as fresh processes, in turns, each into a fresh inference folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-espnet"
WORKDIR_VAR = "E3P_REALESPNET_WORKDIR"
FLAGS = [
    "--stages",
    "infer",
    "measure",
    "--training_config",
    "conf/training.yaml",
    "--metrics_config",
    "conf/metrics.yaml",
]


def recipe_folder() -> Path | None:
    """The trained mini_an4 recipe of ``$E3P_REALESPNET_WORKDIR``, when it and .venv-espnet exist."""
    chosen = os.environ.get(WORKDIR_VAR)
    recipe = Path(chosen) / "egs3" / "mini_an4" / "esp2_asr" if chosen else None
    if (
        recipe is None
        or not (recipe / "exp" / "training" / "last.ckpt").is_file()
        or not (VENV / "bin" / "python").is_file()
    ):
        return None
    return recipe


def _environ(recipe: Path) -> dict[str, str]:
    egs3 = recipe.parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(egs3.parent), str(egs3 / "TEMPLATE" / "esp2_asr"), str(recipe)])
    env["PATH"] = os.pathsep.join([str(ROOT / "tests" / "realespnet"), str(VENV / "bin"), env.get("PATH", "")])
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", ESPNET3_PREFECT_HOME=str(recipe.parent / "bench-home"))
    return env


def one_run(recipe: Path, side: str, name: str) -> float:
    """Seconds of one ``infer`` + ``measure`` by ``side`` ("upstream" or "ours") into a fresh folder."""
    conf = recipe / "conf" / f"{name}.yaml"
    shutil.copyfile(recipe / "conf" / "inference_parallel.yaml", conf)
    shutil.rmtree(recipe / "exp" / "training" / name, ignore_errors=True)
    cmd = (
        [str(VENV / "bin" / "python"), "run.py"]
        if side == "upstream"
        else [str(VENV / "bin" / "espnet3-prefect"), "run"]
    )
    started = time.perf_counter()
    subprocess.run(
        [*cmd, *FLAGS, "--inference_config", f"conf/{name}.yaml"],
        cwd=recipe,
        env=_environ(recipe),
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


COLLECT_STATS = ["--stages", "collect_stats", "--training_config", "conf/training_asr_streaming_parallel.yaml"]


def one_collect_stats(recipe: Path, side: str) -> float:
    """Seconds of one ``collect_stats`` by ``side`` into a fresh stats folder (the config's ``stats_dir``)."""
    shutil.rmtree(recipe / "exp" / "stats_parallel", ignore_errors=True)
    cmd = (
        [str(VENV / "bin" / "python"), "run.py"]
        if side == "upstream"
        else [str(VENV / "bin" / "espnet3-prefect"), "run"]
    )
    started = time.perf_counter()
    subprocess.run([*cmd, *COLLECT_STATS], cwd=recipe, env=_environ(recipe), check=True, capture_output=True)
    return time.perf_counter() - started


def compare(recipe: Path, rounds: int = 2, collect_stats: bool = False) -> dict[str, list[float]]:
    """Both sides in turns (load from other processes falls on both alike)."""
    times: dict[str, list[float]] = {"upstream": [], "ours": []}
    for i in range(rounds):
        for side in ("upstream", "ours") if i % 2 == 0 else ("ours", "upstream"):
            run = one_collect_stats(recipe, side) if collect_stats else one_run(recipe, side, f"inference_bench_{side}")
            times[side].append(run)
    return times
