"""Fixtures of the parity layer: the two venvs, the data, and the session's run pool.

Without ``.venv-parity`` (``bash scripts/parity_setup.sh``) or ``$E3P_PARITY_PYTHON`` (a Python where
ESPnet3 202611 imports, e.g. ``.venv-espnet/bin/python``) every parity test skips, unless
``E3P_REQUIRE_PARITY=1`` (CI), where that is a failure. The runs the selected tests need start
together at the beginning of the session, ``E3P_PARITY_JOBS`` (default 3) at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .harness import PYTHONS, RECIPES, ROOT, ParityRuns, find_fsdd, keys_for, python_ok

REQUIRE = os.environ.get("E3P_REQUIRE_PARITY") == "1"


@pytest.fixture(scope="session")
def parity_venvs() -> None:
    """Both venvs are there: ``.venv`` without espnet3, ``.venv-parity`` with it."""
    problems = []
    if not python_ok("parity", "import espnet3.systems.base.inference, espnet3.systems.base.metric"):
        problems.append(
            f"{PYTHONS['parity']} missing or cannot import espnet3 "
            "(run: bash scripts/parity_setup.sh, or set E3P_PARITY_PYTHON)"
        )
    if not PYTHONS["venv"].exists():
        problems.append(f"{PYTHONS['venv']} missing (run: bash scripts/setup.sh)")
    elif python_ok("venv", "import espnet3"):
        problems.append(f"espnet3 is importable in {PYTHONS['venv']}: the 'without espnet3' runs would not be")
    if problems:
        message = "; ".join(problems)
        if REQUIRE:
            pytest.fail(f"E3P_REQUIRE_PARITY=1: {message}")
        pytest.skip(message)


@pytest.fixture(scope="session")
def fsdd_recordings():
    return find_fsdd()


@pytest.fixture(scope="session")
def parity_dtmf(tmp_path_factory):
    """13 DTMF utterances, noisy enough that the model makes a few mistakes; dtmf_000004 is made
    silent, so its hypothesis is empty (an SCP line ``"dtmf_000004 "`` and an empty hyp to score)."""
    import numpy as np

    from dtmf_demo.dtmf import make_corpus, read_wav, write_wav

    corpus = make_corpus(tmp_path_factory.mktemp("parity-dtmf"), 13, seed=7, noise_db=-16.0)
    silent = corpus / "wav" / "dtmf_000004.wav"
    samples, rate = read_wav(silent)
    write_wav(silent, np.zeros_like(samples), rate)
    return corpus


def _needs_fsdd(key: tuple) -> bool:
    from .harness import METRICS_CASES

    names = [k for k in key[1:] if isinstance(k, str)]
    recipes = [RECIPES[n] for n in names if n in RECIPES]
    recipes += [RECIPES[METRICS_CASES[n].inference] for n in names if n in METRICS_CASES]
    return any(r.data == "fsdd" for r in recipes)


@pytest.fixture(scope="session")
def runs(request, parity_venvs, prefect_server, parity_dtmf, fsdd_recordings, tmp_path_factory):
    keep = os.environ.get("E3P_PARITY_WORKDIR")  # a folder to keep the runs and logs in (cleared first)
    if keep:
        base = Path(keep).resolve()
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
    else:
        base = tmp_path_factory.mktemp("parity")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "E3P_HOOK_LOG"}
    env.update(
        PREFECT_API_URL=prefect_server,
        PREFECT_HOME=str(base / "prefect-client"),
        PYTHONPATH=str(ROOT),
        ESPNET3_PREFECT_HOME=str(base / "e3p-home"),
        PYTHONUNBUFFERED="1",
    )
    pool = ParityRuns(base, env, parity_dtmf, fsdd_recordings, jobs=int(os.environ.get("E3P_PARITY_JOBS", "3")))
    for item in request.session.items:  # the selected tests, after -k/-m
        if item.get_closest_marker("parity") is None:
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        for key in keys_for(item.originalname, params):
            if fsdd_recordings is None and _needs_fsdd(key):
                continue
            pool.submit(key)
    yield pool
    pool.close()


@pytest.fixture
def need_fsdd(fsdd_recordings):
    def check(*names: str) -> None:
        from .harness import METRICS_CASES

        for name in names:
            recipe = RECIPES.get(name) or RECIPES[METRICS_CASES[name].inference]
            if recipe.data == "fsdd" and fsdd_recordings is None:
                pytest.skip(
                    f"FSDD recordings not found (shared/data/fsdd/recordings beside the checkout, "
                    f"or $E3P_FSDD_DIR); {name} uses them"
                )

    return check


@pytest.fixture(scope="session")
def signatures(parity_venvs) -> dict:
    proc = subprocess.run(
        [str(PYTHONS["parity"]), "-m", "tests.parity.signatures"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, f"tests.parity.signatures failed: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)
