"""The README's quick commands run as written, and what it says about set-up matches the project files."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
TOP = README.split("\n## Running your recipe", 1)[0]  # "Two commands": set-up, demo, deployments


def bash_blocks(text: str) -> list[list[str]]:
    return [[line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
            for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_quick_prefect_commands_have_the_venv_and_the_api_url_they_need():
    """`prefect deployment run ...` needs the venv's `prefect` and PREFECT_API_URL of the server started
    just before: each quick-start block that runs `prefect` sets both, for the port it started."""
    prose = re.sub(r"```.*?```", "", TOP, flags=re.S)
    assert "prefect deployment run" not in prose  # only inside a block that can run as written
    blocks = [b for b in bash_blocks(TOP) if any(line.startswith("prefect ") for line in b)]
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
    for path in ("recipes/dtmf/exp/dtmf/inference/test_clean/hyp.scp", "exp/dtmf/data/test_clean/text",
                 ".e3p/prefect/server.log"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path
