"""Whether a drop-in call (``infer``, ``measure``, ``run``) comes from a script's unguarded top level.

Local Dask workers are spawned processes, which re-run the script that started them as module
``__mp_main__`` (Python's multiprocessing rule). A stage started at a script's top level, outside
``if __name__ == "__main__":``, would start again inside each worker, which then fails to start:
hundreds of lines of tracebacks and "Nanny failed to start" in the driver. :func:`check_main_guard`
says it on one line instead, before anything starts, by reading the calling script: the top-level
statement the call runs from must sit under the guard.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from espnet3_prefect.errors import ConfigError

MESSAGE = (
    "{what} was called at the top level of {script}; put the script's top-level code under "
    '`if __name__ == "__main__":` (local Dask workers re-import the main script, as with any '
    "multiprocessing program)"
)


def _is_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either operand order).

    >>> _is_guard(ast.parse('if __name__ == "__main__":\\n    pass').body[0])
    True
    """
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return False
    sides = [node.test.left, node.test.comparators[0]]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    consts = {s.value for s in sides if isinstance(s, ast.Constant)}
    return isinstance(node.test.ops[0], ast.Eq) and names == {"__name__"} and consts == {"__main__"}


def unguarded_line(source: str, line: int) -> bool:
    """Whether line ``line`` of a script runs at its top level outside the main guard.

    >>> src = 'import x\\nx.infer(1)\\nif __name__ == "__main__":\\n    x.infer(2)\\n'
    >>> unguarded_line(src, 2), unguarded_line(src, 4)
    (True, False)
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        end = getattr(node, "end_lineno", node.lineno)
        if node.lineno <= line <= end:
            return not _is_guard(node)
    return False


def check_main_guard(what: str) -> None:
    """Stop when ``what`` (e.g. ``infer()``) runs from the main script's top level outside the guard,
    before anything starts: the one line on stderr, exit status 2 (as the command line's config errors;
    the call is at the script's top level, so an exception would end it too, after a traceback). In a
    worker's re-import of the main script: :class:`ConfigError`."""
    main = sys.modules.get("__main__")
    if getattr(main, "__name__", None) == "__mp_main__":
        raise ConfigError(MESSAGE.format(what=what, script=getattr(main, "__file__", "the main script")))
    path = getattr(main, "__file__", None)
    if not path:  # an interactive session or a notebook: workers re-import nothing
        return
    frame = sys._getframe(1)
    namespace = vars(main)
    while frame is not None and not (frame.f_globals is namespace and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return
    try:
        source = Path(path).read_text(encoding="utf-8")
    except OSError:
        return
    if unguarded_line(source, frame.f_lineno):
        print(f"error: {MESSAGE.format(what=what, script=path)}", file=sys.stderr, flush=True)
        raise SystemExit(2)


__all__ = ["check_main_guard", "unguarded_line"]
