"""Parity with the real ESPnet3 202611: upstream ``infer()``/``measure()`` against espnet3-prefect.

Upstream runs with 1 worker through ``tests.parity.oracle`` in ``.venv-parity``; ours through
the ``espnet3-prefect`` CLI with 1 and 2 workers, in ``.venv`` (espnet3 not importable: the
configs' ESPnet3 ``_target_`` paths resolve to our classes and the recipes subclass ours) and in
``.venv-parity`` (espnet3 importable: the real classes run under our flow). Every file upstream
merges under ``<inference_dir>/<test>/`` must be byte-identical; artifact paths, which name the
run's own folder and shard, are compared by id, path shape and the bytes of the file they name.

    bash scripts/parity_setup.sh && bash scripts/test.sh -m parity
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .harness import (
    OUTPUT_RECIPES,
    PREFETCH_ENGAGED,
    RECIPES,
    RunResult,
    compare_outputs,
    hook_calls,
    manifest_problems,
    run_roots,
    top_files,
)

pytestmark = [pytest.mark.parity, pytest.mark.slow]

VENVS = ("venv", "parity")
MATRIX = [(recipe, venv, n) for recipe in OUTPUT_RECIPES for venv in VENVS for n in (1, 2)]


def ids(params) -> str:
    return "-".join(str(p) for p in params)


def require_ok(run: RunResult, what: str) -> RunResult:
    if run.note:
        pytest.fail(f"{what}: {run.note}")
    if not run.ok:
        pytest.fail(f"{what} failed: {run.reason()}  (log: {run.log})")
    return run


def upstream(runs, recipe: str) -> RunResult:
    return require_ok(runs.get(("up", recipe)), f"upstream infer() on {recipe} (the oracle itself)")


def report(diffs: list[str], limit: int = 8) -> str:
    return "\n  ".join(diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else []))


# -- the oracle itself ---------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", [*OUTPUT_RECIPES, "hooks"])
def test_oracle_runs(runs, need_fsdd, recipe):
    """Upstream infer() runs every recipe and merges something (else no comparison means anything)."""
    need_fsdd(recipe)
    up = upstream(runs, recipe)
    assert top_files(up.test_dir(RECIPES[recipe].test)), f"upstream wrote no merged file: {up.log}"


# -- outputs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe,venv,n", MATRIX, ids=[ids(p) for p in MATRIX])
def test_infer_matches_upstream(runs, need_fsdd, recipe, venv, n):
    """Every merged file under <inference_dir>/<test>/ is byte-identical to upstream's."""
    need_fsdd(recipe)
    up = upstream(runs, recipe)
    ours = require_ok(runs.get(("ours", recipe, venv, n)), f"espnet3-prefect infer ({venv}, {n} workers)")
    diffs = compare_outputs(up, ours, RECIPES[recipe].test)
    assert not diffs, f"outputs differ from upstream:\n  {report(diffs)}"


MANIFEST = [(recipe, venv, 2) for recipe in OUTPUT_RECIPES for venv in VENVS]


@pytest.mark.parametrize("recipe,venv,n", MANIFEST, ids=[ids(p) for p in MANIFEST])
def test_manifest_matches_upstream_schema(runs, need_fsdd, recipe, venv, n):
    """manifest.json in upstream's schema, its items (batches) in upstream's order, each shard done."""
    need_fsdd(recipe)
    up = upstream(runs, recipe)
    ours = require_ok(runs.get(("ours", recipe, venv, n)), f"espnet3-prefect infer ({venv}, {n} workers)")
    problems = manifest_problems(up, ours, RECIPES[recipe].test)
    assert not problems, "manifest.json:\n  " + report(problems)


# -- interop -------------------------------------------------------------------------------------
# What upstream raises about a folder it will not resume (espnet3/parallel/base_runner.py):
# a manifest whose plan differs from its own, a shard locked by someone else, a shard not done.
UPSTREAM_FOLDER_ERRORS = (
    "Cannot resume",
    "already locked",
    "is not complete",
    "Invalid shard manifest",
    "Shard manifest is missing",
)
UP_ON_OURS = [("stock", "venv", 1), ("stock", "venv", 2), ("stock", "parity", 2), ("batching", "venv", 2)]


@pytest.mark.parametrize("recipe,venv,n", UP_ON_OURS, ids=[ids(p) for p in UP_ON_OURS])
def test_upstream_on_our_folder(runs, recipe, venv, n):
    """Upstream infer() on a folder we wrote resumes it completely or raises its own error;
    it never exits 0 having merged fewer (or other) lines."""
    up = upstream(runs, recipe)
    require_ok(runs.get(("ours", recipe, venv, n)), f"precondition: espnet3-prefect infer ({venv}, {n} workers)")
    result = runs.get(("up_on_ours", recipe, venv, n))
    if result.note:
        pytest.fail(result.note)
    if result.ok:
        diffs = compare_outputs(up, result, RECIPES[recipe].test)
        assert not diffs, (
            "upstream infer() on our folder exited 0 but its merged files differ from a clean "
            f"upstream run (silent data loss):\n  {report(diffs)}"
        )
    else:
        reason = result.reason()
        assert any(message in reason for message in UPSTREAM_FOLDER_ERRORS), (
            f"upstream infer() on our folder failed, but not with one of its own errors about the folder "
            f"(manifest / lock / done): {reason}"
        )


OURS_ON_UP = [("stock", "venv", 2), ("batching", "parity", 2)]


@pytest.mark.parametrize("recipe,venv,n", OURS_ON_UP, ids=[ids(p) for p in OURS_ON_UP])
def test_ours_on_upstream_folder(runs, recipe, venv, n):
    """Our CLI on a folder upstream wrote completes it with upstream's bytes."""
    up = upstream(runs, recipe)
    result = runs.get(("ours_on_up", recipe, venv, n))
    require_ok(result, f"espnet3-prefect infer ({venv}, {n} workers) on upstream's folder")
    diffs = compare_outputs(up, result, RECIPES[recipe].test)
    assert not diffs, f"after resuming upstream's folder our outputs differ:\n  {report(diffs)}"


# -- what hooks receive --------------------------------------------------------------------------
def _call_difference(up_entry: dict, our_entry: dict) -> str:
    parts = []
    if up_entry.get("args") != our_entry.get("args"):
        parts.append(
            f"args {json.dumps(our_entry.get('args'))[:300]} vs upstream {json.dumps(up_entry.get('args'))[:300]}"
        )
    up_kw, our_kw = up_entry.get("kwargs", {}), our_entry.get("kwargs", {})
    missing, extra = sorted(set(up_kw) - set(our_kw)), sorted(set(our_kw) - set(up_kw))
    if missing:
        parts.append(f"missing kwargs {missing}")
    if extra:
        parts.append(f"extra kwargs {extra}")
    changed = {k: (our_kw[k], up_kw[k]) for k in sorted(set(up_kw) & set(our_kw)) if our_kw[k] != up_kw[k]}
    for key, (ours, theirs) in changed.items():
        parts.append(f"{key}={json.dumps(ours)[:160]} (upstream {json.dumps(theirs)[:160]})")
    for key in sorted(set(up_entry) | set(our_entry)):
        if key not in ("hook", "args", "kwargs") and up_entry.get(key) != our_entry.get(key):
            parts.append(
                f"{key}={json.dumps(our_entry.get(key))[:200]} (upstream {json.dumps(up_entry.get(key))[:200]})"
            )
    return "; ".join(parts) or "same"


def _summary(entry: dict) -> str:
    return f"args {json.dumps(entry.get('args'))[:200]}, kwargs {sorted(entry.get('kwargs', {}))}"


# Either way of building the env is the protocol (issue 10): build_worker_setup_fn() on the driver
# with its function shipped to the workers (what upstream infer() does, always on Dask), or
# build_env_local(). Whichever ours calls, it must call one of them.
ENV_BUILDERS = ("provider.build_env_local", "provider.build_worker_setup_fn")


@pytest.mark.parametrize("venv", VENVS)
def test_hook_arguments_match_upstream(runs, venv):
    """A recorder runner/provider logs every hook call; ours must make the same calls with the same
    positional and keyword arguments (paths, shard numbers and shard counts normalized)."""
    _same_hook_calls(upstream(runs, "hooks"), runs.get(("ours", "hooks", venv, 1)))


@pytest.mark.parametrize("venv", VENVS)
def test_hooks_get_the_same_arguments_with_prefetch(runs, venv):
    """The same, with shards of several items, so forward gets the prefetch view of the dataset: its
    type, arguments and every other hook's arguments are upstream's."""
    ours = runs.get(("ours", "hooks", venv, 1, PREFETCH_ENGAGED))
    _assert_prefetched(ours, "test_a")
    _same_hook_calls(upstream(runs, "hooks"), ours)


def _assert_prefetched(ours: RunResult, test: str) -> None:
    require_ok(ours, "espnet3-prefect infer with prefetch engaged")
    markers = sorted(ours.test_dir(test).glob("split.*/done"))
    depths = {json.loads(m.read_text())["timing"]["prefetch"] for m in markers}
    assert markers and depths == {2}, f"prefetch did not engage: depths {depths} in {len(markers)} markers"


PREFETCH_MATRIX = [(recipe, venv) for recipe in ("stock", "batching", "contract", "writer_hooks") for venv in VENVS]


@pytest.mark.parametrize("recipe,venv", PREFETCH_MATRIX, ids=[ids(p) for p in PREFETCH_MATRIX])
def test_infer_matches_upstream_with_prefetch(runs, need_fsdd, recipe, venv):
    """Every merged file is byte-identical to upstream's with the next items read ahead."""
    need_fsdd(recipe)
    up = upstream(runs, recipe)
    ours = runs.get(("ours", recipe, venv, 1, PREFETCH_ENGAGED))
    _assert_prefetched(ours, RECIPES[recipe].test)
    diffs = compare_outputs(up, ours, RECIPES[recipe].test)
    assert not diffs, f"outputs differ from upstream with prefetch:\n  {report(diffs)}"


def _same_hook_calls(up: RunResult, ours: RunResult) -> None:
    up_calls = hook_calls(up.cwd / "hooks.jsonl", run_roots(up))
    our_calls = hook_calls(ours.cwd / "hooks.jsonl", run_roots(ours))
    diffs = []
    if not any(our_calls.get(name) for name in ENV_BUILDERS):
        diffs.append(f"provider: neither {' nor '.join(ENV_BUILDERS)} was called")
    for hook in sorted(set(up_calls) | set(our_calls)):
        if hook in ENV_BUILDERS:
            continue
        theirs, mine = up_calls.get(hook, []), our_calls.get(hook, [])
        if theirs == mine:
            continue
        if hook.startswith("#"):
            diffs.append(f"{hook[1:]} called {mine[0]} times, upstream {theirs[0]}")
        elif not mine:
            diffs.append(f"{hook}: never called (upstream calls it)")
        elif not theirs:
            diffs.append(f"{hook}: called, upstream never calls it")
        else:
            missing = [json.loads(e) for e in theirs if e not in mine]
            extra = [json.loads(e) for e in mine if e not in theirs]
            if missing and extra:
                diffs.append(f"{hook}: {_call_difference(missing[0], extra[0])}")
            elif missing:
                diffs.append(f"{hook}: upstream also calls it with {_summary(missing[0])}")
            else:
                diffs.append(f"{hook}: ours also calls it with {_summary(extra[0])}")
    status = "" if ours.ok else f" (and our run failed: {ours.reason()})"
    assert not diffs, f"hook calls differ from upstream{status}:\n  {report(diffs, 12)}"


# -- signatures ----------------------------------------------------------------------------------
SIGNATURES = [
    "BaseRunner.__init__",
    "BaseRunner.__call__",
    "BaseRunner.forward",
    "BaseRunner.open_writers",
    "BaseRunner.write_record",
    "BaseRunner.close_writers",
    "BaseRunner.merge",
    "BaseRunner.init_state",
    "BaseRunner.reduce_state",
    "BaseRunner.finalize_state",
    "InferenceRunner.__init__",
    "InferenceRunner.__call__",
    "InferenceRunner.forward",
    "InferenceRunner.open_writers",
    "InferenceRunner.write_record",
    "InferenceRunner.close_writers",
    "InferenceRunner.merge",
    "InferenceRunner.init_state",
    "InferenceRunner.reduce_state",
    "InferenceRunner.finalize_state",
    "InferenceRunner.prepare_model_inputs",
    "InferenceRunner.format_output",
    "EnvironmentProvider.__init__",
    "EnvironmentProvider.build_env_local",
    "EnvironmentProvider.build_worker_setup_fn",
    "InferenceProvider.__init__",
    "InferenceProvider.build_env_local",
    "InferenceProvider.build_worker_setup_fn",
    "InferenceProvider.build_dataset",
    "InferenceProvider.build_model",
    "infer",
    "measure",
]


def _signature(info: dict) -> str:
    params = info.get("params")
    if params is None:
        return info.get("binding", "?")
    shown = []
    for name, kind, default in params:
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        text = prefix + name + ("" if default == "<required>" or prefix else f"={default}")
        if kind == "KEYWORD_ONLY" and not any(s.startswith("*") for s in shown):
            shown.append("*")
        shown.append(text)
    return f"{info.get('binding')} ({', '.join(shown)})"


@pytest.mark.parametrize("name", SIGNATURES)
def test_signature(signatures, name):
    """Same parameters (names, kinds, defaults) and the same static/class/instance binding."""
    assert name in signatures, f"{name}: not reported by tests.parity.signatures"
    theirs, ours = signatures[name]["espnet3"], signatures[name]["espnet3_prefect"]
    same = (theirs.get("binding"), theirs.get("params")) == (ours.get("binding"), ours.get("params"))
    assert same, f"{name}: espnet3_prefect {_signature(ours)}; espnet3 {_signature(theirs)}"


# -- metrics -------------------------------------------------------------------------------------
METRICS = ("dataset_text", "scp_stems")
METRICS_MATRIX = [(case, venv) for case in METRICS for venv in VENVS]


@pytest.mark.parametrize("case", METRICS)
def test_oracle_measure_runs(runs, need_fsdd, case):
    need_fsdd(case)
    result = require_ok(runs.get(("measure_up", case)), f"upstream measure() on {case} (the oracle itself)")
    assert (result.out_root / "metrics.json").is_file()


@pytest.mark.parametrize("case,venv", METRICS_MATRIX, ids=[ids(p) for p in METRICS_MATRIX])
def test_metrics_json_matches_upstream(runs, need_fsdd, case, venv):
    """``espnet3-prefect metrics`` writes upstream measure()'s metrics.json, byte for byte.

    For ``dataset:<column>`` inputs measure() needs the inference config (it reads the column from
    the test set); ours is given it as ``--inference-config FILE [k=v ...]``, the oracle's flag."""
    need_fsdd(case)
    up = require_ok(runs.get(("measure_up", case)), f"upstream measure() on {case}")
    ours = require_ok(runs.get(("measure_ours", case, venv)), f"espnet3-prefect metrics ({venv})")
    theirs_bytes = (up.out_root / "metrics.json").read_bytes()
    ours_path = ours.out_root / "metrics.json"
    assert ours_path.is_file(), f"no metrics.json in {ours.out_root}"
    ours_bytes = ours_path.read_bytes()
    if ours_bytes != theirs_bytes:
        theirs_json, ours_json = json.loads(theirs_bytes), json.loads(ours_bytes)
        what = "equal as JSON but not in bytes" if theirs_json == ours_json else "different content"
        pytest.fail(
            f"metrics.json: {what}:\n  ours     {ours_bytes.decode()[:600]!r}\n"
            f"  upstream {theirs_bytes.decode()[:600]!r}"
        )


def _written_by(after: Path, before: Path) -> list[str]:
    """Files under ``after`` that are new or changed against ``before`` (what a stage wrote)."""
    names = []
    for path in sorted(after.rglob("*")):
        if not path.is_file() or path.name == "metrics.json":
            continue
        rel = path.relative_to(after)
        if any(part.startswith(".") for part in rel.parts):
            continue
        old = before / rel
        if not old.is_file() or old.read_bytes() != path.read_bytes():
            names.append(str(rel))
    return names


@pytest.mark.parametrize("case,venv", METRICS_MATRIX, ids=[ids(p) for p in METRICS_MATRIX])
def test_metrics_files_match_upstream(runs, need_fsdd, case, venv):
    """The other files measure() writes per test set (dataset/<column>.scp, <metric>_alignment)."""
    need_fsdd(case)
    from .harness import METRICS_CASES

    up_infer = upstream(runs, METRICS_CASES[case].inference)
    up = require_ok(runs.get(("measure_up", case)), f"upstream measure() on {case}")
    ours = require_ok(runs.get(("measure_ours", case, venv)), f"espnet3-prefect metrics ({venv})")
    written = _written_by(up.out_root, up_infer.out_root)
    assert written, "upstream measure() wrote no file besides metrics.json (nothing to compare)"
    diffs = []
    for rel in written:
        mine = ours.out_root / rel
        if not mine.is_file():
            diffs.append(f"{rel}: missing")
        elif mine.read_bytes() != (up.out_root / rel).read_bytes():
            diffs.append(f"{rel}: differs")
    assert not diffs, "files measure() writes:\n  " + report(diffs)


# -- drop-in entry points ------------------------------------------------------------------------
def test_dropin_entry_points(runs):
    """A run.py calling ``from espnet3_prefect import infer, measure`` with upstream's signatures
    (``infer(config)``, ``measure(metrics_config, inference_config=...)``) writes upstream's files."""
    up = upstream(runs, "stock")
    measured = require_ok(runs.get(("measure_up", "scp_stems")), "upstream measure() on scp_stems")
    result = require_ok(runs.get(("dropin", "venv")), "run.py with espnet3_prefect.infer/measure")
    diffs = compare_outputs(up, result, RECIPES["stock"].test)
    ours_metrics = result.out_root / "metrics.json"
    if not ours_metrics.is_file():
        diffs.append("metrics.json: missing")
    elif ours_metrics.read_bytes() != (measured.out_root / "metrics.json").read_bytes():
        diffs.append("metrics.json: differs from upstream measure()'s")
    assert not diffs, "drop-in run.py outputs differ from upstream:\n  " + report(diffs)
