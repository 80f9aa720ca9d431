"""The real ESPnet 202611 mini_an4/esp2_asr recipe, run end to end by upstream code (the oracle).

The ``mini_an4`` fixture copies the recipe out of the installed espnet wheel (``egs3`` is package
data there) into a temporary folder, points ``conf/training.yaml`` at the streaming debug config
(as ESPnet's CI does) and runs the upstream ``run.py`` stage by stage: create_dataset,
train_tokenizer, collect_stats, train, infer and measure with ``conf/inference_serial.yaml`` (one
worker: the reference), and collect_stats with ``conf/training_asr_streaming_serial.yaml``. Tests
then run our entry points in the same folder, so both sides use one trained model (training has no
seed, so two trainings give different models).

Without the real ESPnet the tests skip, naming the command that builds the environment; with
``E3P_REQUIRE_REAL_ESPNET=1`` they fail instead. ``E3P_REALESPNET_WORKDIR`` keeps the work folder
there: a finished oracle in it is reused (our outputs are rebuilt each time).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .compare import compared_files

HERE = Path(__file__).resolve().parent
SETUP = "bash scripts/real_espnet_setup.sh, then .venv-espnet/bin/python -m pytest -m realespnet tests/realespnet"
REQUIRE_VAR = "E3P_REQUIRE_REAL_ESPNET"
WORKDIR_VAR = "E3P_REALESPNET_WORKDIR"
RECIPE_PACKAGE = "egs3.mini_an4.esp2_asr"
STREAMING = "training_asr_streaming.yaml"
TRAINING = ("--training_config", "conf/training.yaml")
SERIAL = ("--inference_config", "conf/inference_serial.yaml")
METRICS = ("--metrics_config", "conf/metrics.yaml")
DONE_MARK = ".oracle-done"
STAGE_TIMEOUT_S = 1800

# {row label: {"upstream": seconds, "ours": seconds}}, printed at the end of the session.
TIMINGS: dict[str, dict[str, float]] = {}
# The F5-TTS recipe's (test_f5tts.py): {stage: {side: seconds}}, its own table.
F5_TIMINGS: dict[str, dict[str, float]] = {}


def real_espnet_available() -> bool:
    try:
        return importlib.util.find_spec(RECIPE_PACKAGE) is not None
    except ImportError:  # no egs3 at all
        return False


def require_real_espnet() -> None:
    """Skip (or, with E3P_REQUIRE_REAL_ESPNET=1, fail) when the real ESPnet recipe is not importable."""
    if real_espnet_available():
        return
    message = f"the real ESPnet 202611 ({RECIPE_PACKAGE}) is not importable here; run: {SETUP}"
    if os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def copy_recipe(dest: Path) -> Path:
    """The installed mini_an4/esp2_asr and TEMPLATE/esp2_asr under ``dest/egs3/`` (the repository's
    layout, which the recipe's path.sh relies on); returns the recipe folder."""
    from importlib.resources import as_file, files

    with as_file(files("egs3")) as installed:
        installed = Path(installed)
        for rel in ("mini_an4/esp2_asr", "TEMPLATE/esp2_asr"):
            shutil.copytree(installed / rel, dest / "egs3" / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for rel in ("__init__.py", "mini_an4/__init__.py", "TEMPLATE/__init__.py"):
            if (installed / rel).is_file():
                shutil.copy2(installed / rel, dest / "egs3" / rel)
    recipe = dest / "egs3" / "mini_an4" / "esp2_asr"
    for needed in ("run.py", "downloads.tar.gz", f"conf/{STREAMING}"):
        assert (recipe / needed).is_file(), f"the installed recipe has no {needed}"
    link = recipe / "conf" / "training.yaml"
    link.unlink(missing_ok=True)
    link.symlink_to(STREAMING)
    return recipe


def recipe_env(recipe: Path, prefect_home: Path) -> dict[str, str]:
    """The environment both sides run in: path.sh's PYTHONPATH, our sph2pipe and this venv first on
    PATH, no GPU, and a Prefect state folder of the test's own (no user's server is involved)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    egs3 = recipe.parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(egs3.parent), str(egs3 / "TEMPLATE" / "esp2_asr"), str(recipe)])
    env["PATH"] = os.pathsep.join([str(HERE), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONUNBUFFERED"] = "1"
    env["ESPNET3_PREFECT_HOME"] = str(prefect_home)
    return env


def record_time(label: str, side: str, seconds: float) -> None:
    TIMINGS.setdefault(label, {})[side] = seconds


@dataclass
class Recipe:
    """The recipe folder both sides run in, and how to run a command there (logged and timed)."""

    root: Path
    recipe: Path
    env: dict[str, str]
    logs: Path
    state: dict = field(default_factory=dict)  # what one test leaves for another (e.g. (a) for (e))

    def run(
        self, name: str, cmd: list[str], *, label: str | None = None, side: str = "ours", check: bool = True
    ) -> subprocess.CompletedProcess:
        """Run ``cmd`` in the recipe folder; output to ``logs/<name>.log``; fails the test on a non-zero exit."""
        started = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, cwd=self.recipe, env=self.env, capture_output=True, text=True, timeout=STAGE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as err:
            pytest.fail(f"{name}: no answer in {STAGE_TIMEOUT_S} s: {' '.join(cmd)}\n{err.stderr or ''}", pytrace=False)
        seconds = time.monotonic() - started
        log = self.logs / f"{name}.log"
        log.write_text(
            f"$ {' '.join(cmd)}\n# exit {proc.returncode} after {seconds:.1f} s\n"
            f"## stdout\n{proc.stdout}\n## stderr\n{proc.stderr}"
        )
        if check and proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            pytest.fail(f"{name} exited {proc.returncode} (log {log}):\n$ {' '.join(cmd)}\n{tail}", pytrace=False)
        if label and proc.returncode == 0:
            record_time(label, side, seconds)
        return proc

    def upstream(self, name: str, *args: str, label: str | None = None) -> subprocess.CompletedProcess:
        return self.run(name, [sys.executable, "run.py", *args], label=label, side="upstream")

    @property
    def serial_dir(self) -> Path:
        return self.recipe / "exp" / "training" / "inference_serial"

    def conf_copy(self, source: str, name: str) -> str:
        """A copy of ``conf/<source>`` as ``conf/<name>`` (its stem names its inference_dir)."""
        shutil.copyfile(self.recipe / source, self.recipe / "conf" / name)
        return f"conf/{name}"


def run_oracle(recipe: Recipe) -> None:
    """The upstream stages, each one ``python run.py`` call, as ESPnet's CI chains them."""
    for stage in ("create_dataset", "train_tokenizer", "collect_stats", "train"):
        recipe.upstream(f"upstream_{stage}", "--stages", stage, *TRAINING, label=stage)
    recipe.upstream("upstream_infer", "--stages", "infer", *TRAINING, *SERIAL, label="infer")
    recipe.upstream("upstream_measure", "--stages", "measure", *TRAINING, *SERIAL, *METRICS, label="measure")
    recipe.upstream(
        "upstream_collect_stats_serial",
        "--stages",
        "collect_stats",
        "--training_config",
        "conf/training_asr_streaming_serial.yaml",
        label="collect_stats (stats_serial)",
    )
    infer, measure = TIMINGS["infer"]["upstream"], TIMINGS["measure"]["upstream"]
    record_time("infer + measure", "upstream", infer + measure)


@pytest.fixture(scope="session")
def mini_an4(tmp_path_factory) -> Recipe:
    """The recipe folder with the upstream oracle's outputs (see the module docstring)."""
    require_real_espnet()
    kept = os.environ.get(WORKDIR_VAR)
    root = Path(kept).resolve() if kept else tmp_path_factory.mktemp("mini_an4")
    recipe_dir = root / "egs3" / "mini_an4" / "esp2_asr"
    done = (root / DONE_MARK).is_file()
    if not done:
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        copy_recipe(root)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    recipe = Recipe(root, recipe_dir, recipe_env(recipe_dir, root / "prefect-home"), logs)
    if not done:
        started = time.monotonic()
        run_oracle(recipe)
        record_time("upstream oracle, all stages", "upstream", time.monotonic() - started)
        (root / DONE_MARK).write_text("")
    compared_files(recipe.serial_dir)  # the oracle is complete (raises otherwise)
    assert (recipe.recipe / "exp" / "stats_serial" / "train" / "stats_keys").is_file(), "no upstream stats_serial"
    return recipe


def timing_table() -> list[str]:
    def cell(value):
        return f"{value:9.1f}" if value is not None else f"{'-':>9}"

    width = max(len(label) for label in TIMINGS)
    lines = [f"{'stage':<{width}}  {'upstream':>9}  {'ours':>9}"]
    for label, sides in TIMINGS.items():
        lines.append(f"{label:<{width}}  {cell(sides.get('upstream'))}  {cell(sides.get('ours'))}")
    return lines


def f5_timing_table() -> list[str]:
    """One row per F5-TTS stage, one column per side that ran it (upstream, ours: run/launch/cli)."""
    sides = list(dict.fromkeys(side for row in F5_TIMINGS.values() for side in row))
    width = max(len(stage) for stage in F5_TIMINGS)
    lines = [f"{'stage':<{width}}  " + "  ".join(f"{side:>20}" for side in sides)]
    for stage, row in F5_TIMINGS.items():
        cells = [f"{row[side]:20.1f}" if side in row else f"{'-':>20}" for side in sides]
        lines.append(f"{stage:<{width}}  " + "  ".join(cells))
    return lines


def pytest_terminal_summary(terminalreporter):
    tables = []
    if TIMINGS:
        tables.append(
            (
                "mini_an4 wall times, seconds (upstream: 1 worker; ours: 2 Dask workers)",
                timing_table(),
                "realespnet_timings.txt",
            )
        )
    if F5_TIMINGS:
        tables.append(
            (
                "fsdd_f5tts stage wall times, seconds (upstream: 1 worker; ours: 2 Dask workers)",
                f5_timing_table(),
                "f5tts_timings.txt",
            )
        )
    for title, lines, name in tables:
        terminalreporter.write_sep("-", title)
        for line in lines:
            terminalreporter.write_line(line)
        artifacts = os.environ.get("E3P_TEST_ARTIFACTS")
        if artifacts:
            path = Path(artifacts) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n")
            terminalreporter.write_line(f"(also in {path})")
