"""The import graph of espnet3_prefect (flows/ and tasks/ as espnet3_prefect.flows / .tasks), read from
the source: every import statement counts, also those inside functions. Prints each module's
imports of our own modules and any import cycle; exits 1 when there is a cycle. ``--packages``
prints the graph between packages instead (a top-level module such as ``entry`` is its own package;
the root ``__init__`` is ``espnet3_prefect``), with how many module imports make each arrow.

    .venv/bin/python scripts/import_graph.py [--dot] [--packages]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "espnet3_prefect"
FOLDERS = {PACKAGE: ROOT / PACKAGE, f"{PACKAGE}.flows": ROOT / "flows", f"{PACKAGE}.tasks": ROOT / "tasks"}


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of the package."""
    found = {}
    for prefix, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def _statements(tree: ast.AST):
    """Every import statement, except those under ``if TYPE_CHECKING:`` (not imported at run time)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _statements_of(child))
            continue
        yield from _statements_of(node)


def _statements_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _statements(node)


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``name`` imports (the most specific known module each statement names)."""
    is_package = path.name == "__init__.py"
    base = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in _statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            anchor = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join([*anchor, *(node.module.split(".") if node.module else [])])
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            # ``from pkg import submodule`` imports the submodule; ``from pkg import name``, pkg itself
            targets = [t for t in submodules if t in known] or [module]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def package_of(module: str) -> str:
    """The package a module belongs to: the first name under ``espnet3_prefect``.

    >>> package_of("espnet3_prefect.pipeline.shard"), package_of("espnet3_prefect.entry"), package_of("espnet3_prefect")
    ('pipeline', 'entry', 'espnet3_prefect')
    """
    return module.split(".")[1] if "." in module else module


def package_graph(edges: dict[str, set[str]] | None = None) -> dict[str, dict[str, int]]:
    """Package -> {package it imports: how many module imports make that arrow}; within a package, none."""
    found: dict[str, dict[str, int]] = {}
    for module, targets in (graph() if edges is None else edges).items():
        arrows = found.setdefault(package_of(module), {})
        for target in targets:
            if package_of(target) != package_of(module):
                arrows[package_of(target)] = arrows.get(package_of(target), 0) + 1
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def main() -> int:
    edges = graph()
    if "--packages" in sys.argv:
        packages = package_graph(edges)
        for package, arrows in sorted(packages.items()):
            print(f"{package:16} -> {', '.join(f'{t} ({n})' for t, n in sorted(arrows.items())) or '-'}")
        found = cycles({p: set(a) for p, a in packages.items()})
        for component in found:
            print("package cycle:", " <-> ".join(component), file=sys.stderr)
        arrows = sum(map(len, packages.values()))
        print(f"{len(packages)} packages, {arrows} arrows, {len(found)} cycle(s)", file=sys.stderr)
        return 1 if found else 0
    short = lambda m: m[len(PACKAGE) + 1 :] or PACKAGE  # noqa: E731
    if "--dot" in sys.argv:
        print("digraph imports {")
        for node, targets in sorted(edges.items()):
            for target in sorted(targets):
                print(f'  "{short(node)}" -> "{short(target)}";')
        print("}")
    else:
        for node, targets in sorted(edges.items()):
            print(f"{short(node):28} -> {', '.join(short(t) for t in sorted(targets)) or '-'}")
    found = cycles(edges)
    for component in found:
        print("cycle:", " <-> ".join(short(m) for m in component), file=sys.stderr)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, {len(found)} cycle(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
