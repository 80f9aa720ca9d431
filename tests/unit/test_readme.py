"""The README's and the documentation site's commands and examples run as written, and what they say
about set-up matches the project files.

Every fenced block of README.md and docs/**/*.md is read (tests/helpers/pages.py). Commands (```bash) are split into
single commands and each one is checked against what would run it: our CLI's own parser accepts its
arguments, scripts, modules and repository files exist, `prefect deployment run` names a deployment
of prefect.yaml; a program tests/helpers/pages.py does not know fails the test, so a new kind of command on a page
comes with its check. Python blocks compile and import only names that exist; YAML blocks load, and a
`parallel:` block passes our validator. The slow tests run the commands that are cheap to run for
real and compare what they print with what the page shows.
"""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT
from tests.helpers.pages import (
    CONSOLE,
    DIRECTIVES,
    FENCE,
    PAGES,
    TEXT_LANGUAGES,
    all_blocks,
    bash_blocks,
    check_command,
    commands,
    console_commands,
    fenced_blocks,
    offline_inventories,
    page_command,
    run_as_written,
)

README = (ROOT / "README.md").read_text()
TOP = README.split("\n## Your recipe", 1)[0]  # what a new user reads first: set-up, demo, deployments


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_command_on_the_page_names_what_exists_and_parses(page):
    blocks = [
        body if language == "bash" else console_commands(body)
        for language, body in fenced_blocks(PAGES[page])
        if language in ("bash", CONSOLE)
    ]
    for body in blocks:
        for argv in commands(body):
            check_command(argv, page)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_fenced_block_has_a_language_we_check(page):
    for language, body in fenced_blocks(PAGES[page]):
        assert language in {"bash", CONSOLE, "python", "yaml"} | TEXT_LANGUAGES | DIRECTIVES, (
            f"{page}: a ``` block without a known language: {body[:60]!r}"
        )


def test_python_examples_compile_and_import_what_exists():
    blocks = all_blocks("python")
    assert blocks
    for page, body in blocks:
        tree = compile(body, page, "exec", flags=ast.PyCF_ONLY_AST)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("espnet3_prefect"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{page}: from {node.module} import {alias.name}"


def test_yaml_examples_load_and_parallel_blocks_validate():
    from espnet3_prefect.execution.spec import ParallelSpec

    blocks = all_blocks("yaml")
    assert any("parallel" in (yaml.safe_load(body) or {}) for _, body in blocks)
    for _page, body in blocks:
        data = yaml.safe_load(body)
        if isinstance(data, dict) and "parallel" in data:
            ParallelSpec.from_config(data["parallel"])  # a ConfigError names the key


def test_scheduler_pages_show_the_blocks_their_snapshots_were_rendered_from():
    """docs/schedulers/<env>.md: each `parallel-<name>` block is the one tests/unit/test_job_scripts.py
    renders into tests/snapshots/job_script_<name>.txt, and the page includes that snapshot."""
    from tests.unit.test_job_scripts import BLOCKS, KUBE_BLOCK

    shown = {}
    for page, text in PAGES.items():
        for name, body in re.findall(r"^```\{code-block\} yaml\n:name: parallel-(\S+)\n\n(.*?)^```", text, re.M | re.S):
            shown[name] = (page, yaml.safe_load(body)["parallel"])
    assert set(shown) == set(BLOCKS) | {"kube"}
    for name, (page, block) in shown.items():
        assert block == (KUBE_BLOCK if name == "kube" else BLOCKS[name]), f"{page}: parallel-{name} differs"
        snapshot = "kube_cluster_arguments" if name == "kube" else f"job_script_{name}"
        assert f"tests/snapshots/{snapshot}.txt" in PAGES[page], f"{page} does not include {snapshot}"


def test_pages_link_to_files_that_exist():
    for page, text in PAGES.items():
        base = (ROOT / page).parent
        prose = FENCE.sub("", text)
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if not re.match(r"[a-z]+:", target):  # not https:, mailto:
                assert (base / target).exists(), f"{page}: link to {target}, which does not exist"


def test_readme_is_the_short_version():
    """About 8 KB: what a speech researcher gets, the two commands, the one-import switch, a config with a
    `parallel:` block, the backends and their extras, links into the site."""
    assert len(README.encode()) < 9000
    for heading in ("## Two commands", "## Your recipe", "## A minimal config", "## Backends"):
        assert heading in README


def test_quick_prefect_commands_have_the_venv_and_the_api_url_they_need():
    """`prefect deployment run ...` needs the venv's `prefect` and PREFECT_API_URL of the server started
    just before: each quick-start block that runs `prefect` sets both, for the port it started."""
    for text in (TOP, PAGES["docs/quickstart.md"]):
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        assert "prefect deployment run" not in prose  # only inside a block that can run as written
        blocks = [b for b in bash_blocks(text) if any(line.startswith("prefect ") for line in b)]
        assert blocks, "the quick start shows no deployment run"
        for block in blocks:
            first = next(i for i, line in enumerate(block) if line.startswith("prefect "))
            before = block[:first]
            ports = [m for line in before for m in re.findall(r"deploy[-_]local(?:\.sh)? .*--port (\d+)", line)]
            assert "source .venv/bin/activate" in before
            assert ports and f"export PREFECT_API_URL=http://127.0.0.1:{ports[-1]}/api" in before


def test_readme_torch_advice_matches_the_pinned_torch():
    """The CPU torch the README installs first must satisfy the extras' pin, or setup.sh would
    replace it with the CUDA build."""
    pins = set(re.findall(r'"torch==([\d.]+)"', (ROOT / "pyproject.toml").read_text()))
    assert len(pins) == 1
    [pin] = pins
    assert "several GB" in TOP
    assert f"pip install torch=={pin} --index-url https://download.pytorch.org/whl/cpu" in TOP


def test_outputs_of_a_run_from_the_recipe_folder_are_ignored_by_git():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in (
        "recipes/dtmf/exp/dtmf/inference/test_clean/hyp.scp",
        "exp/dtmf/data/test_clean/text",
        ".e3p/prefect/server.log",
        "docs/_build/html/index.html",
    ):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path


@pytest.mark.slow
def test_stats_demo_prints_the_numbers_the_page_shows(tmp_path):
    """docs/workloads.md shows the stats demo's output; the in-process command, run as written (in a
    copy of the recipe's config folder so the repository's exp/ is left alone), prints those numbers."""
    command = page_command("docs/workloads.md", r"stats\.yaml '~parallel'")
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    result = run_as_written(command.replace("python ", f"{sys.executable} ", 1), tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [shown] = [
        body
        for language, body in fenced_blocks(PAGES["docs/workloads.md"])
        if language == "text" and "log-mel dims" in body
    ]

    def numbers(text: str) -> tuple[str, str]:
        frames = re.search(r"^\d+ utterances, \d+ frames x \d+ log-mel dims", text, re.M).group(0)
        stats = re.search(r"^mean\[:3\] = .*$", text, re.M).group(0)
        return frames, stats

    assert numbers(result.stdout) == numbers(shown)


@pytest.mark.slow
def test_cluster_script_commands_run_as_written():
    """`espnet3-prefect cluster-script` as the README and the scheduler pages show it, on the repository's
    own files: it prints a job script and submits nothing."""
    pytest.importorskip("dask_jobqueue", reason='pip install "espnet3-prefect[slurm]"')
    command = page_command("docs/schedulers/index.md", r"^espnet3-prefect cluster-script ")
    result = run_as_written(command, ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "#SBATCH -p debug" in result.stdout and "nothing was submitted" in result.stderr


def test_intersphinx_names_import_from_the_installed_packages_and_cover_the_pages():
    """The site's links into Prefect, Dask, distributed and dask-jobqueue come from inventories written at
    build time (nothing is downloaded): every listed name must import from the installed package, and
    every role on a page that names one of those projects must be listed (else it renders unlinked)."""
    pytest.importorskip("dask_jobqueue", reason='pip install "espnet3-prefect[slurm]"')
    inventories = offline_inventories()
    listed = {name for project in inventories.PROJECTS for name, _, _ in inventories.entries(project)}
    external = ("prefect", "prefect_dask", "dask", "distributed", "dask_jobqueue")
    for page, text in PAGES.items():
        for target in re.findall(r"\{(?:py:)?(?:class|func|meth|mod|obj|data|attr)\}`~?([\w.]+)`", text):
            if target.split(".")[0] in external:
                assert target in listed, f"{page}: {target} is not in docs/_ext/offline_inventories.py"


def test_metric_files_the_pages_name_are_the_files_wer_and_cer_write(tmp_path):
    """The README and the quickstart name the alignment files of the demo's test_noisy; they are the
    files our WER and CER write into a test set's folder (no `.txt`, no brace pattern)."""
    pytest.importorskip("jiwer", reason='pip install "espnet3-prefect[metrics]"')
    from espnet3_prefect.metrics import CER, WER

    (tmp_path / "ref.scp").write_text("u1 a b c d\n")
    (tmp_path / "hyp.scp").write_text("u1 a x c\n")
    for metric in (WER(), CER()):
        metric({"ref": tmp_path / "ref.scp", "hyp": tmp_path / "hyp.scp"}, "test_noisy", tmp_path)
    written = {path.name for path in (tmp_path / "test_noisy").iterdir()}
    for page in ("README.md", "docs/quickstart.md", "docs/metrics.md"):
        named = {name.rstrip(".") for name in re.findall(r"([\w{},]+_alignment[\w.]*)", PAGES[page])}
        assert named and named <= written, f"{page} names {sorted(named)}; WER and CER write {sorted(written)}"
