"""Parity harness: runs upstream and ours as subprocesses (a few at a time) and compares outputs.

Runs are named by keys and cached for the session:

| key | what |
|---|---|
| ``("up", recipe)`` | upstream ``infer()`` via ``tests.parity.oracle`` in ``.venv-parity``, 1 worker |
| ``("ours", recipe, venv, n, *overrides)`` | ``espnet3-prefect infer ... n_workers=n [overrides]`` in ``venv`` |
| ``("up_on_ours", recipe, venv, n)`` | upstream ``infer()`` on a copy of the folder ``("ours", ...)`` wrote |
| ``("ours_on_up", recipe, venv, n)`` | ours on a copy of the folder ``("up", recipe)`` wrote |
| ``("measure_up", case)`` / ``("measure_ours", case, venv)`` | metrics on a copy of an upstream inference folder |
| ``("dropin", venv)`` | a recipe ``run.py`` calling ``from espnet3_prefect import infer, measure`` |

``venv`` is ``venv`` (espnet3 not importable) or ``parity`` (importable). A run's dependencies are
submitted before it, so a thread waiting on one never blocks the pool.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECIPES_DIR = ROOT / "tests" / "parity" / "recipes"
# The venv where ESPnet3 202611 imports: $E3P_PARITY_PYTHON (CI: .venv-espnet, the real espnet[train,asr]
# install), else .venv-parity (scripts/parity_setup.sh: the wheel's espnet3/ beside our dependencies).
PYTHONS = {
    "venv": ROOT / ".venv" / "bin" / "python",
    "parity": Path(os.environ.get("E3P_PARITY_PYTHON") or ROOT / ".venv-parity" / "bin" / "python"),
}
RUN_TIMEOUT_S = float(os.environ.get("E3P_PARITY_TIMEOUT", "300"))
# Orchestration-only setting of ours (Prefect task retries): a failing shard fails at once instead
# of retrying with delays; it changes nothing a hook sees or an output holds.
OURS_EXTRA = ("+runner.retries=0",)
# Two shards of several items each, so the shard loop reads ahead (prefetch, on by default, needs a
# shard of two units or more; with its default plan a 13-item set gets one item per shard).
PREFETCH_ENGAGED = "+parallel.num_shards=2"


def override(key: str, path: Any) -> str:
    """``key=<path>``, the path quoted for Hydra's override grammar (a run folder's name holds ``+``
    and ``=``: ``ours-hooks-venv-1-+parallel.num_shards=2``), as every side reads its overrides."""
    from espnet3_prefect.config.load import quote_override_value

    return f"{key}={quote_override_value(str(path))}"


@dataclass(frozen=True)
class Recipe:
    name: str
    config: str  # relative to tests/parity/recipes
    data: str  # "dtmf" or "fsdd"
    test: str = "test_a"
    template: bool = False  # run from a copy of the recipe folder, config untouched
    hook_log: bool = False

    @property
    def config_path(self) -> Path:
        return RECIPES_DIR / self.config


RECIPES = {
    r.name: r
    for r in (
        Recipe("stock", "stock/inference.yaml", "dtmf"),
        Recipe("writer_hooks", "writer_hooks/inference.yaml", "fsdd"),
        Recipe("batching", "batching/inference.yaml", "dtmf"),
        Recipe("artifacts", "artifacts/inference.yaml", "dtmf"),
        Recipe("contract", "contract/inference.yaml", "fsdd"),
        Recipe("template", "template/conf/inference.yaml", "fsdd", test="fsdd_eval", template=True),
        Recipe("custom_provider", "custom_provider/inference.yaml", "fsdd"),
        Recipe("hooks", "hooks/inference.yaml", "dtmf", hook_log=True),
    )
}
# The output-comparison recipes (hooks is compared by its log instead).
OUTPUT_RECIPES = [name for name in RECIPES if name != "hooks"]


@dataclass(frozen=True)
class MetricsCase:
    name: str
    config: str  # relative to tests/parity/recipes
    inference: str  # the recipe whose upstream inference folder is scored
    with_inference_config: bool


METRICS_CASES = {
    m.name: m
    for m in (
        MetricsCase("dataset_text", "metrics/metrics_dataset.yaml", "contract", True),
        MetricsCase("scp_stems", "metrics/metrics_stems.yaml", "stock", False),
    )
}


@dataclass
class RunResult:
    key: tuple
    cmd: list[str]
    cwd: Path
    rc: int | None
    seconds: float
    log: Path
    inference_dir: str = ""  # as configured (may be relative to cwd)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def out_root(self) -> Path:
        """The inference folder on disk."""
        path = Path(self.inference_dir)
        return path if path.is_absolute() else self.cwd / path

    def test_dir(self, test: str) -> Path:
        return self.out_root / test

    def text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def reason(self) -> str:
        """One line saying why the run failed (the last error line of its log)."""
        if self.rc is None:
            return f"timed out after {RUN_TIMEOUT_S:.0f} s ({self.log})"
        lines = [ln.strip() for ln in self.text().splitlines() if ln.strip()]
        patterns = (
            r"^error: ",
            r"^[\w-]+: error: ",
            r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b.*:",
            r"^[A-Za-z_.]*Error$",
        )
        for line in reversed(lines):
            if any(re.search(p, line) for p in patterns):
                return shorten(line)
        return shorten(lines[-1]) if lines else f"exit code {self.rc}, no output"

    def describe(self) -> str:
        what = "ok" if self.ok else f"FAILED (exit {self.rc}): {self.reason()}"
        return f"{' '.join(map(str, self.key))}: {what} [{self.seconds:.0f} s, log {self.log}]"


def shorten(line: str, limit: int = 300) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def venv_python(venv: str) -> Path:
    return PYTHONS[venv]


def find_fsdd() -> Path | None:
    """The FSDD recordings: $E3P_FSDD_DIR, else shared/data/fsdd/recordings beside the checkout
    (or beside any folder above it, for worktrees)."""
    env = os.environ.get("E3P_FSDD_DIR")
    candidates = [Path(env)] if env else []
    candidates += [p / "shared" / "data" / "fsdd" / "recordings" for p in ROOT.parents]
    for path in candidates:
        if path.is_dir() and any(path.glob("*.wav")):
            return path
    return None


class ParityRuns:
    """Starts runs on a small thread pool (each a subprocess) and caches their results."""

    def __init__(self, base: Path, env: dict[str, str], dtmf_dir: Path, fsdd_dir: Path | None, jobs: int = 3):
        self.base, self.env, self.dtmf_dir, self.fsdd_dir = base, env, dtmf_dir, fsdd_dir
        self.pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="parity")
        self.futures: dict[tuple, Future] = {}
        self.lock = threading.RLock()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    # -- scheduling ------------------------------------------------------------------------
    def deps(self, key: tuple) -> list[tuple]:
        kind = key[0]
        if kind == "up_on_ours":
            return [("up", key[1]), ("ours", *key[1:])]
        if kind == "ours_on_up":
            return [("up", key[1])]
        if kind == "measure_up":
            return [("up", METRICS_CASES[key[1]].inference)]
        if kind == "measure_ours":
            return [("up", METRICS_CASES[key[1]].inference), ("measure_up", key[1])]
        if kind == "dropin":
            return [("up", "stock"), ("measure_up", "scp_stems")]
        return []

    def submit(self, key: tuple) -> Future:
        with self.lock:
            if key in self.futures:
                return self.futures[key]
            for dep in self.deps(key):
                self.submit(dep)
            future = self.pool.submit(self._execute, key)
            self.futures[key] = future
            return future

    def get(self, key: tuple) -> RunResult:
        return self.submit(key).result()

    # -- running ---------------------------------------------------------------------------
    def _slug(self, key: tuple) -> str:
        return "-".join(str(k) for k in key)

    def _run(
        self, key: tuple, cmd: list[str], cwd: Path, inference_dir: str, extra_env: dict[str, str] | None = None
    ) -> RunResult:
        log = self.base / "logs" / f"{self._slug(key)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.env, **(extra_env or {})}
        started = time.perf_counter()
        with open(log, "wb") as out:
            out.write(("$ " + " ".join(map(str, cmd)) + f"\n# cwd {cwd}\n").encode())
            out.flush()
            proc = subprocess.Popen(
                [str(c) for c in cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                rc: int | None = proc.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = None
        return RunResult(key, [str(c) for c in cmd], cwd, rc, time.perf_counter() - started, log, inference_dir)

    def _data_overrides(self, recipe: Recipe) -> list[str]:
        if recipe.template:
            return []
        if recipe.data == "fsdd":
            return [override("fsdd_dir", self.fsdd_dir)]
        return [override("data_dir", self.dtmf_dir)]

    def _workspace(self, key: tuple, recipe: Recipe) -> tuple[Path, str, str, list[str]]:
        """(cwd, config path as passed, inference_dir as configured, overrides) for a fresh run."""
        run_dir = self.base / "runs" / self._slug(key)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        if recipe.template:
            recipe_dir = run_dir / "recipe"
            (recipe_dir / "conf").mkdir(parents=True)
            shutil.copy2(recipe.config_path, recipe_dir / "conf" / recipe.config_path.name)
            (recipe_dir / "data").mkdir()
            (recipe_dir / "data" / "fsdd").symlink_to(self.fsdd_dir)
            # the TEMPLATE's inference_dir: ${recipe_dir}/exp/${exp_tag}/${self_name:} with recipe_dir "."
            return recipe_dir, f"conf/{recipe.config_path.name}", "exp/parity/inference", []
        run_dir.mkdir(parents=True)
        inference_dir = str(run_dir / "exp")
        return (
            run_dir,
            str(recipe.config_path),
            inference_dir,
            [override("inference_dir", inference_dir), *self._data_overrides(recipe)],
        )

    def _hook_env(self, recipe: Recipe, cwd: Path) -> dict[str, str]:
        return {"E3P_HOOK_LOG": str(cwd / "hooks.jsonl")} if recipe.hook_log else {}

    def _oracle_infer(
        self, key: tuple, recipe: Recipe, cwd: Path, config: str, inference_dir: str, overrides: list[str]
    ) -> RunResult:
        cmd = [venv_python("parity"), "-m", "tests.parity.oracle", "infer", "--config", config, *overrides]
        return self._run(key, cmd, cwd, inference_dir, self._hook_env(recipe, cwd))

    def _ours_infer(
        self,
        key: tuple,
        recipe: Recipe,
        venv: str,
        n: int,
        cwd: Path,
        config: str,
        inference_dir: str,
        overrides: list[str],
        extra: tuple = (),
    ) -> RunResult:
        cmd = [
            venv_python(venv),
            "-m",
            "espnet3_prefect.cli",
            "infer",
            "--config",
            config,
            *overrides,
            f"parallel.n_workers={n}",
            *OURS_EXTRA,
            *extra,
        ]
        return self._run(key, cmd, cwd, inference_dir, self._hook_env(recipe, cwd))

    def _copy_of(self, key: tuple, recipe: Recipe, source: RunResult) -> tuple[Path, str, list[str]]:
        """A copy of ``source``'s run folder for ``key`` (same layout: the config still applies)."""
        run_dir = self.base / "runs" / self._slug(key)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        src_dir = source.cwd if recipe.template else Path(source.inference_dir).parent
        shutil.copytree(src_dir, run_dir if not recipe.template else run_dir / "recipe", symlinks=True)
        if recipe.template:
            cwd = run_dir / "recipe"
            return cwd, "exp/parity/inference", []
        inference_dir = str(run_dir / "exp")
        return run_dir, inference_dir, [override("inference_dir", inference_dir), *self._data_overrides(recipe)]

    def _execute(self, key: tuple) -> RunResult:
        kind = key[0]
        if kind == "up":
            recipe = RECIPES[key[1]]
            cwd, config, inference_dir, overrides = self._workspace(key, recipe)
            return self._oracle_infer(key, recipe, cwd, config, inference_dir, overrides)
        if kind == "ours":
            recipe, venv, n = RECIPES[key[1]], key[2], key[3]
            cwd, config, inference_dir, overrides = self._workspace(key, recipe)
            return self._ours_infer(key, recipe, venv, n, cwd, config, inference_dir, overrides, key[4:])
        if kind == "up_on_ours":
            recipe = RECIPES[key[1]]
            source = self.get(("ours", *key[1:]))
            if not source.ok:
                return _not_run(key, source)
            cwd, inference_dir, overrides = self._copy_of(key, recipe, source)
            config = f"conf/{recipe.config_path.name}" if recipe.template else str(recipe.config_path)
            return self._oracle_infer(key, recipe, cwd, config, inference_dir, overrides)
        if kind == "ours_on_up":
            recipe, venv, n = RECIPES[key[1]], key[2], key[3]
            source = self.get(("up", key[1]))
            if not source.ok:
                return _not_run(key, source)
            cwd, inference_dir, overrides = self._copy_of(key, recipe, source)
            config = f"conf/{recipe.config_path.name}" if recipe.template else str(recipe.config_path)
            return self._ours_infer(key, recipe, venv, n, cwd, config, inference_dir, overrides)
        if kind in ("measure_up", "measure_ours"):
            return self._measure(key)
        if kind == "dropin":
            return self._dropin(key)
        raise ValueError(f"unknown run key {key!r}")

    def _measure(self, key: tuple) -> RunResult:
        case = METRICS_CASES[key[1]]
        recipe = RECIPES[case.inference]
        source = self.get(("up", case.inference))
        if not source.ok:
            return _not_run(key, source)
        cwd, inference_dir, overrides = self._copy_of(key, recipe, source)
        metrics_config = str(RECIPES_DIR / case.config)
        args = ["--config", metrics_config, override("inference_dir", inference_dir)]
        if case.with_inference_config:
            args += ["--inference-config", str(recipe.config_path), *overrides]
        if key[0] == "measure_up":
            cmd = [venv_python("parity"), "-m", "tests.parity.oracle", "measure", *args]
        else:
            cmd = [venv_python(key[2]), "-m", "espnet3_prefect.cli", "metrics", *args]
        return self._run(key, cmd, cwd, inference_dir)

    def _dropin(self, key: tuple) -> RunResult:
        recipe = RECIPES["stock"]
        cwd, config, inference_dir, overrides = self._workspace(key, recipe)
        cmd = [
            venv_python(key[1]),
            "-m",
            "tests.parity.dropin_run",
            "--config",
            config,
            *overrides,
            "--metrics-config",
            str(RECIPES_DIR / METRICS_CASES["scp_stems"].config),
            override("inference_dir", inference_dir),
        ]
        return self._run(key, cmd, cwd, inference_dir)


def _not_run(key: tuple, source: RunResult) -> RunResult:
    return RunResult(
        key,
        [],
        source.cwd,
        -1,
        0.0,
        source.log,
        source.inference_dir,
        note=f"not run: its source run failed: {source.describe()}",
    )


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop a timed-out run and everything it started (its own session), by its pid."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


# -- comparisons -------------------------------------------------------------------------------
def top_files(test_dir: Path) -> list[str]:
    """The files upstream writes at the test-set level (not shard internals, not manifest.json)."""
    if not test_dir.is_dir():
        return []
    return sorted(
        p.name for p in test_dir.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != "manifest.json"
    )


def artifact_prefix(run: RunResult, test: str) -> str:
    """What an artifact path in an SCP starts with: ``<inference_dir as configured>/<test>/split.``"""
    return (Path(run.inference_dir) / test).as_posix() + "/split."


def compare_scp(up: RunResult, ours: RunResult, test: str, name: str, limit: int = 5) -> list[str]:
    """Line by line; artifact paths by id, path shape and the referenced file's bytes."""
    up_lines = (up.test_dir(test) / name).read_bytes().split(b"\n")
    our_lines = (ours.test_dir(test) / name).read_bytes().split(b"\n")
    diffs: list[str] = []
    if len(up_lines) != len(our_lines):
        diffs.append(f"{name}: {len(our_lines) - 1} lines, upstream {len(up_lines) - 1}")
    up_prefix, our_prefix = artifact_prefix(up, test).encode(), artifact_prefix(ours, test).encode()
    for number, (a, b) in enumerate(zip(up_lines, our_lines), 1):
        if a == b and not a.split(b" ", 1)[-1].startswith(up_prefix):
            continue
        utt_a, _, val_a = a.partition(b" ")
        utt_b, _, val_b = b.partition(b" ")
        if val_a.startswith(up_prefix):
            if utt_a != utt_b:
                diffs.append(f"{name}:{number}: id {utt_b!r}, upstream {utt_a!r}")
            elif not val_b.startswith(our_prefix):
                diffs.append(
                    f"{name}:{number}: value {val_b.decode(errors='replace')!r} is not under "
                    f"{our_prefix.decode()}<k>/ (upstream {val_a.decode(errors='replace')!r})"
                )
            else:
                rest_a = re.sub(rb"^\d+/", b"", val_a[len(up_prefix) :])
                rest_b = val_b[len(our_prefix) :]
                if not re.fullmatch(rb"\d+/" + re.escape(rest_a), rest_b):
                    diffs.append(
                        f"{name}:{number}: artifact path {val_b.decode()!r}, upstream "
                        f"{val_a.decode()!r} (expected .../split.<k>/{rest_a.decode()})"
                    )
                else:
                    file_a = _resolve(up, val_a.decode())
                    file_b = _resolve(ours, val_b.decode())
                    if not file_b.is_file():
                        diffs.append(f"{name}:{number}: artifact {file_b} missing")
                    elif file_a.read_bytes() != file_b.read_bytes():
                        diffs.append(
                            f"{name}:{number}: artifact {file_b.name} differs in bytes from upstream's "
                            f"({file_b.stat().st_size} vs {file_a.stat().st_size} bytes)"
                        )
        else:
            diffs.append(f"{name}:{number}: {b.decode(errors='replace')!r}, upstream {a.decode(errors='replace')!r}")
        if len(diffs) >= limit:
            diffs.append("...")
            break
    return diffs


def _resolve(run: RunResult, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else run.cwd / path


def compare_outputs(up: RunResult, ours: RunResult, test: str) -> list[str]:
    """Every file upstream merged under ``<inference_dir>/<test>/`` against ours."""
    names = top_files(up.test_dir(test))
    if not names:
        return [f"upstream wrote no merged file under {up.test_dir(test)}"]
    diffs = []
    for name in names:
        ours_file = ours.test_dir(test) / name
        if not ours_file.is_file():
            diffs.append(f"{name}: missing (ours has: {', '.join(top_files(ours.test_dir(test))) or 'nothing'})")
            continue
        if name.endswith(".scp"):
            diffs.extend(compare_scp(up, ours, test, name))
        elif ours_file.read_bytes() != (up.test_dir(test) / name).read_bytes():
            diffs.append(f"{name}: differs ({first_difference(up.test_dir(test) / name, ours_file)})")
    return diffs


def first_difference(a: Path, b: Path) -> str:
    la, lb = a.read_bytes().split(b"\n"), b.read_bytes().split(b"\n")
    for number, (x, y) in enumerate(zip(la, lb), 1):
        if x != y:
            return f"line {number}: {y.decode(errors='replace')!r}, upstream {x.decode(errors='replace')!r}"
    return f"{len(lb) - 1} lines, upstream {len(la) - 1}"


def manifest_problems(up: RunResult, ours: RunResult, test: str) -> list[str]:
    """Ours must write upstream's manifest schema, consistent with its own shard folders."""
    path = ours.test_dir(test) / "manifest.json"
    if not path.is_file():
        return [f"no manifest.json in {ours.test_dir(test)}"]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return [f"manifest.json is not JSON: {exc}"]
    problems = []
    if not isinstance(data, dict) or sorted(data) != ["output_dir", "shard_subdir", "shards", "version"]:
        return [
            f"manifest.json keys {sorted(data) if isinstance(data, dict) else type(data).__name__}, "
            "upstream ['output_dir', 'shard_subdir', 'shards', 'version']"
        ]
    if data["version"] != 1:
        problems.append(f"version {data['version']!r}, upstream 1")
    expected_dir = str(Path(ours.inference_dir) / test)
    if data["output_dir"] != expected_dir:
        problems.append(f"output_dir {data['output_dir']!r}, upstream would write {expected_dir!r}")
    if data["shard_subdir"] != "":
        problems.append(f"shard_subdir {data['shard_subdir']!r}, upstream ''")
    shards = data["shards"]
    if not isinstance(shards, list) or not all(
        isinstance(s, dict) and sorted(s) == ["items", "shard_id"] for s in shards
    ):
        return problems + ["shards must be a list of {shard_id, items}"]
    ids = [s["shard_id"] for s in shards]
    if ids != list(range(len(ids))):
        problems.append(f"shard ids {ids}, expected 0..{len(ids) - 1}")
    up_manifest = json.loads((up.test_dir(test) / "manifest.json").read_text(encoding="utf-8"))
    up_items = [item for s in up_manifest["shards"] for item in s["items"]]
    our_items = [item for s in shards for item in s["items"]]
    if our_items != up_items:
        problems.append(f"items in shard order {our_items}, upstream {up_items} (batches as lists)")
    for s in shards:
        shard_dir = ours.test_dir(test) / f"split.{s['shard_id']}"
        if not (shard_dir / "done").is_file():
            problems.append(f"{shard_dir.name}: listed in manifest.json but has no done file")
    return problems


# -- hook logs ---------------------------------------------------------------------------------
def normalize_hook_value(value: Any, roots: list[str]) -> Any:
    """Paths of the run -> <OUT>, split.N -> split.<k>, ints -> 'int', lists of paths -> a set."""
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<OUT>")
        return re.sub(r"split\.\d+", "split.<k>", value)
    if isinstance(value, list):
        return [normalize_hook_value(v, roots) for v in value]
    if isinstance(value, dict):
        if set(value) == {"int"}:
            return "int"
        if set(value) == {"list"} and value["list"] and all(isinstance(v, dict) and "Path" in v for v in value["list"]):
            return {"list of Path": sorted({json.dumps(normalize_hook_value(v, roots)) for v in value["list"]})}
        return {k: normalize_hook_value(v, roots) for k, v in value.items()}
    return value


def hook_calls(path: Path, roots: list[str]) -> dict[str, list[str]]:
    """hook -> the distinct normalized calls (JSON), and '#forward'/'#write_record' counts."""
    calls: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = normalize_hook_value(json.loads(line), roots)
            calls.setdefault(entry["hook"], set()).add(json.dumps(entry, sort_keys=True))
            counts[entry["hook"]] = counts.get(entry["hook"], 0) + 1
    out = {hook: sorted(entries) for hook, entries in calls.items()}
    for hook in ("forward", "write_record", "reduce_state"):
        out[f"#{hook}"] = [str(counts.get(hook, 0))]
    return out


def run_roots(run: RunResult) -> list[str]:
    """Strings a run's paths start with, longest first (for normalization)."""
    roots = {str(run.out_root), str(run.out_root.resolve()), run.inference_dir, str(run.cwd)}
    return sorted((r for r in roots if r), key=len, reverse=True)


def python_ok(venv: str, code: str) -> bool:
    python = venv_python(venv)
    return (
        python.exists() and subprocess.run([str(python), "-c", code], capture_output=True, timeout=120).returncode == 0
    )


def keys_for(test: str, params: dict[str, Any]) -> list[tuple]:
    """The runs a parity test needs (so they can start before the test is reached)."""
    recipe = params.get("recipe")
    venv, n = params.get("venv"), params.get("n")
    if test == "test_oracle_runs":
        return [("up", recipe)]
    if test in ("test_infer_matches_upstream", "test_manifest_matches_upstream_schema"):
        return [("up", recipe), ("ours", recipe, venv, n)]
    if test == "test_upstream_on_our_folder":
        return [("up_on_ours", recipe, venv, n)]
    if test == "test_ours_on_upstream_folder":
        return [("ours_on_up", recipe, venv, n)]
    if test == "test_hook_arguments_match_upstream":
        return [("up", "hooks"), ("ours", "hooks", venv, 1)]
    if test == "test_infer_matches_upstream_with_prefetch":
        return [("up", recipe), ("ours", recipe, venv, 1, PREFETCH_ENGAGED)]
    if test == "test_hooks_get_the_same_arguments_with_prefetch":
        return [("up", "hooks"), ("ours", "hooks", venv, 1, PREFETCH_ENGAGED)]
    if test == "test_oracle_measure_runs":
        return [("measure_up", params["case"])]
    if test in ("test_metrics_json_matches_upstream", "test_metrics_files_match_upstream"):
        return [("measure_up", params["case"]), ("measure_ours", params["case"], venv)]
    if test == "test_dropin_entry_points":
        return [("dropin", "venv")]
    return []
