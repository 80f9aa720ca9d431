"""Our entry points on the real mini_an4 recipe, against the upstream serial oracle (conftest.py).

Every run here uses two Dask workers (conf/inference_parallel.yaml, or the parallel collect_stats
config) and must reproduce the one-worker upstream outputs: the merged ``*.scp`` of each test set,
the WER/CER alignments and metrics.json byte for byte; collect_stats' shape files and keys byte for
byte, its sums up to rounding.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from .compare import inference_problems, merged_scp, set_names, stats_problems
from .conftest import METRICS, TRAINING, Recipe

pytestmark = [pytest.mark.realespnet, pytest.mark.slow]

PARALLEL = "conf/inference_parallel.yaml"
RUN_PREFECT = """\
from espnet3.systems.esp2_asr.system import ASRSystem
from espnet3_prefect import launch

if __name__ == "__main__":
    launch(ASRSystem)
"""


def cli() -> list[str]:
    """Our console script from this venv (``python -m espnet3_prefect.cli`` where it is not installed)."""
    script = Path(sys.executable).parent / "espnet3-prefect"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "espnet3_prefect.cli"]


def fresh(folder: Path) -> Path:
    """``folder`` removed (outputs of an earlier session in a kept work folder); returned."""
    if folder.exists():
        shutil.rmtree(folder)
    return folder


def assert_same_as_oracle(recipe: Recipe, ours: Path) -> None:
    problems = inference_problems(recipe.serial_dir, ours)
    assert not problems, "ours differs from the upstream serial run:\n" + "\n".join(problems)


def run_launcher(recipe: Recipe) -> Path:
    """(a): ``espnet3-prefect run --stages infer measure`` into exp/training/inference_prefect_a."""
    if "a" not in recipe.state:
        conf = recipe.conf_copy(PARALLEL, "inference_prefect_a.yaml")
        out = fresh(recipe.recipe / "exp" / "training" / "inference_prefect_a")
        recipe.run(
            "ours_run_infer_measure",
            [*cli(), "run", "--stages", "infer", "measure", *TRAINING, "--inference_config", conf, *METRICS],
            label="infer + measure",
        )
        recipe.state["a"] = out
    return recipe.state["a"]


def test_launcher_infer_measure_matches_upstream(mini_an4):
    """(a) The recipe-style entry point on Prefect, flags as ESPnet3's launcher takes them."""
    assert_same_as_oracle(mini_an4, run_launcher(mini_an4))


def test_plain_cli_infer_then_metrics_matches_upstream(mini_an4):
    """(c) ``espnet3-prefect infer`` then ``espnet3-prefect metrics`` into one chosen folder."""
    out = fresh(mini_an4.recipe / "exp" / "training" / "inference_cli")
    mini_an4.run(
        "ours_cli_infer",
        [*cli(), "infer", "--config", PARALLEL, f"inference_dir={out}", "--training-config", "conf/training.yaml"],
        label="infer",
    )
    mini_an4.run(
        "ours_cli_metrics",
        [
            *cli(),
            "metrics",
            "--config",
            "conf/metrics.yaml",
            f"inference_dir={out}",
            "--training-config",
            "conf/training.yaml",
            "--inference-config",
            PARALLEL,
        ],
        label="measure",
    )
    assert_same_as_oracle(mini_an4, out)


def test_batches_by_duration_keep_upstreams_utterances_in_upstreams_order(mini_an4):
    """``runner.max_duration`` on the real recipe (its runner, ESPnet3's ``ASRInferenceRunner``, writes and
    merges SCP files, so the whole test set is sorted by its audio headers' lengths and the merged lines
    are put back in dataset order): every merged file has upstream's utterances, in upstream's order."""
    out = fresh(mini_an4.recipe / "exp" / "training" / "inference_duration")
    mini_an4.run(
        "ours_cli_infer_duration",
        [*cli(), "infer", "--config", PARALLEL, f"inference_dir={out}", "batch_size=4", "+runner.max_duration=12",
         "--training-config", "conf/training.yaml"],
        label="infer, batches by duration",
    )  # fmt: skip
    oracle = mini_an4.serial_dir
    for name in set_names(oracle):
        scps = [rel for rel in merged_scp(oracle / name) if not rel.startswith("dataset/")]
        assert scps and set(scps) <= set(merged_scp(out / name)), (name, scps)
        for rel in scps:
            keys = [line.split(" ", 1)[0] for line in (out / name / rel).read_text(encoding="utf-8").splitlines()]
            assert keys == [
                line.split(" ", 1)[0] for line in (oracle / name / rel).read_text(encoding="utf-8").splitlines()
            ], (name, rel)
        shards = sorted((out / name).glob("split.*/done"))
        assert shards and all('"keys"' in done.read_text() for done in shards)  # planned in length order


def test_collect_stats_matches_upstream(mini_an4):
    """(d) collect_stats on two workers against upstream's one-worker stats."""
    stats = mini_an4.recipe / "exp"
    fresh(stats / "stats_parallel")
    mini_an4.run(
        "ours_collect_stats_parallel",
        [*cli(), "run", "--stages", "collect_stats", "--training_config", "conf/training_asr_streaming_parallel.yaml"],
        label="collect_stats (stats_serial)",
    )
    problems = stats_problems(stats / "stats_serial", stats / "stats_parallel")
    assert not problems, "collect_stats differs from upstream's serial run:\n" + "\n".join(problems)


def test_finished_stages_are_cached_through_run_py(mini_an4):
    """(b)+(e) A recipe's run.py with our ``launch`` in place of ESPnet3's, on (a)'s finished folder:
    ``--stages infer measure`` is one run of the flow ``recipe`` whose two stages are Cached (their
    records say done, inputs unchanged, outputs intact): nothing is decoded or scored again, and no
    file of the inference folder is written. (The run.py route and ``espnet3-prefect run`` are the same
    launcher; (a) runs the stages for real.)"""
    out = run_launcher(mini_an4)
    metrics = out / "metrics.json"
    assert metrics.is_file(), f"(a) left no {metrics}"
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.suffix != ".log"}
    (mini_an4.recipe / "run_prefect.py").write_text(RUN_PREFECT)
    proc = mini_an4.run(
        "ours_rerun_run_prefect_py",
        [
            sys.executable,
            "run_prefect.py",
            "--stages",
            "infer",
            "measure",
            *TRAINING,
            "--inference_config",
            "conf/inference_prefect_a.yaml",
            *METRICS,
        ],
        label="infer + measure again (run_prefect.py, Cached)",
    )
    cached = [line.split()[0] for line in proc.stdout.splitlines() if line.split()[1:2] == ["Cached"]]
    assert cached == ["infer", "measure"], f"not both stages Cached:\n{proc.stdout}"
    rewritten = [p for p, ns in written.items() if p.stat().st_mtime_ns != ns]
    assert not rewritten, f"written again: {rewritten}"
