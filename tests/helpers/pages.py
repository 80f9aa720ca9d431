"""The README's and the documentation site's pages as tests read them (tests/unit/test_readme.py):
their fenced blocks, and each command of a ```bash block checked against what would run it: a
program :func:`check_command` does not know fails, so a new kind of command comes with its check."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

DOCS = ROOT / "docs"
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    if "_build" not in path.parts
}
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", flags=re.M | re.S)
TEXT_LANGUAGES = {"text"}  # output and diagrams: nothing to run
CONSOLE = "console"  # a session: the `$ ` lines are commands (checked as bash's), the rest is their output
DIRECTIVES = {"{toctree}", "{image}", "{figure}", "{literalinclude}", "{code-block}", "{eval-rst}"}


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block; a ``{code-block} yaml`` is ("yaml", body less options)."""
    blocks = []
    for info, body in FENCE.findall(text):
        words = info.split()
        language = words[0] if words else ""
        if language == "{code-block}":
            language = words[1]
            body = "\n".join(line for line in body.splitlines() if not line.startswith(":"))
        blocks.append((language, body))
    return blocks


def bash_blocks(text: str) -> list[list[str]]:
    return [
        [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
        for language, block in fenced_blocks(text)
        if language == "bash"
    ]


def all_blocks(language: str) -> list[tuple[str, str]]:
    return [(page, body) for page, text in PAGES.items() for lang, body in fenced_blocks(text) if lang == language]


def console_commands(block: str) -> str:
    """The commands of a ```console block (its ``$ `` lines), as a bash block's body."""
    return "\n".join(line[2:] for line in block.splitlines() if line.startswith("$ "))


def commands(block: str) -> list[list[str]]:
    """Each command of a bash block as argv: continuations joined, comments dropped, split at ; && |."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        line = line.split("  #")[0].strip()
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        argv: list[str] = []
        for token in lexer:
            if token in (";", "&&", "||", "|"):
                out.append(argv)
                argv = []
            else:
                argv.append(token)
        out.append(argv)
    return [argv for argv in out if argv]


def synopsis(argv: list[str]) -> list[str]:
    """A synopsis as the arguments it stands for: ``[x]`` -> x, ``[key=value ...]`` dropped."""
    out = []
    for token in argv:
        if token.startswith("[") and (token.endswith("...]") or token == "[key=value"):
            continue
        if token in ("...]", "..."):
            continue
        out.append(token.strip("[]"))
    return out


def repo_path(token: str) -> Path | None:
    """A path in this repository a command names (recipes/..., deployments/..., scripts/...), else None."""
    first = token.split("/", 1)[0]
    if "/" in token and first in {"recipes", "deployments", "scripts", "tests", "docs", "benchmarks"}:
        return ROOT / token
    return None


def check_cli(args: list[str], where: str) -> None:
    from espnet3_prefect.cli import build_parser

    parser = build_parser()
    try:
        parsed, rest = parser.parse_known_args(args)
    except SystemExit:
        pytest.fail(f"{where}: espnet3-prefect {' '.join(args)}: the CLI refuses these arguments")
    if rest and not getattr(parsed, "passes_through", False):
        # key=value overrides are positional config arguments; anything else is unknown
        pytest.fail(f"{where}: espnet3-prefect {' '.join(args)}: unrecognized {rest}")


def deployment_names() -> set[str]:
    table = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    flows = {"infer": "infer", "metrics": "metrics", "evaluate": "evaluate"}
    names = set()
    for deployment in table["deployments"]:
        flow = deployment["entrypoint"].rsplit(":", 1)[1]
        names.add(f"{flows.get(flow, flow)}/{deployment['name']}")
    return names


PREFECT_SUBCOMMANDS = {
    ("server", "start"),
    ("worker", "start"),
    ("--no-prompt", "deploy"),
    ("deploy",),
    ("work-pool", "create"),
    ("flow-run", "logs"),
    ("flow-run", "inspect"),
    ("flow-run", "cancel"),
    ("deployment", "run"),
}


def check_command(argv: list[str], where: str) -> None:
    """One command as a page shows it: does what it names exist, and do its arguments parse?"""
    program, args = argv[0], argv[1:]
    for token in argv:
        path = repo_path(token.strip("[]'\""))
        if path is not None:
            assert path.exists(), f"{where}: {' '.join(argv)}: {path.relative_to(ROOT)} does not exist"
    program = program.removeprefix(".venv/bin/")
    if re.fullmatch(r"[A-Z_]+=.*", program):  # VAR=value command ...
        return check_command(args, where) if args else None
    if program in {"source", "export", "cd", "eval", "sphinx-build"}:
        return None
    if program == "bash":
        assert args and (ROOT / args[0]).is_file(), f"{where}: bash {args[:1]}: no such script"
        return None
    if program.endswith(".sh"):
        assert (ROOT / program).is_file(), f"{where}: {program}: no such script"
        return None
    if program == "espnet3-prefect":
        return check_cli(synopsis(args), where)
    if re.fullmatch(r"python(3(\.\d+)?)?", program):
        if args[:1] == ["-m"]:
            module = args[1]
            if module in {"venv", "pip", "pytest"}:
                return None
            assert importlib.util.find_spec(module) is not None, f"{where}: python -m {module}: no such module"
            return None
        if args[:1] and args[0].endswith(".py"):  # a script of the repository or of a recipe folder in it
            folders = [ROOT, *ROOT.glob("recipes/*/egs3/*/*")]
            assert any((d / args[0]).is_file() for d in folders), f"{where}: python {args[0]}: no such script"
            return None
        pytest.fail(f"{where}: {' '.join(argv)}: a python command this test does not know how to check")
    if program == "pip":
        assert args[:1] == ["install"], f"{where}: {' '.join(argv)}"
        return None
    if program == "prefect":
        words = tuple(a for a in args if not a.startswith("--") or a == "--no-prompt")
        assert any(words[: len(sub)] == sub for sub in PREFECT_SUBCOMMANDS), f"{where}: prefect {' '.join(args)}"
        if words[:2] == ("deployment", "run"):
            name = words[2].strip("'\"")
            assert name in deployment_names(), f"{where}: no deployment {name!r} in prefect.yaml"
        return None
    pytest.fail(f"{where}: `{' '.join(argv)}`: a program this test does not know how to check ({program})")


def run_as_written(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A page's command, run from the repository root with the venv's programs first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def page_command(page: str, pattern: str) -> str:
    [line] = [line for block in bash_blocks(PAGES[page]) for line in block if re.search(pattern, line)]
    return line


def offline_inventories():
    spec = importlib.util.spec_from_file_location("offline_inventories", DOCS / "_ext" / "offline_inventories.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
