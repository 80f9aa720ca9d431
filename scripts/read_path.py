"""Which of our files one ``infer`` run calls into, in call order: what a reader follows through the code.

Runs ``espnet3-prefect infer`` on the DTMF demo (1 local worker, a fresh output folder, the embedded
server) in this process with a profile hook on, and records every call of a function defined in
``espnet3_prefect/``, ``flows/`` or ``tasks/`` made inside the flow function ``infer`` (the driver side;
the workers run the tasks). Prints, for all those calls and for those that receive the config (an
OmegaConf ``DictConfig`` argument):

* for all calls, for calls of module-level functions (no methods, properties or dunders) and for
  calls given the config: calls, the distinct files, the file sequence with repeats collapsed (a file
  change is a step), and how often a step goes back to a file already left;
* the file sequence itself (``--show``).

``--whole``: every call of ours in the driver process, from the command line's start (the front door
too: where the run plan is built and the inputs checked before the server starts), not only inside
the flow function.

    .venv/bin/python scripts/read_path.py [--show] [--whole]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = tuple(str(ROOT / d) + os.sep for d in ("espnet3_prefect", "flows", "tasks"))


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_known_args(argv)
    show = "--show" in sys.argv
    whole = "--whole" in sys.argv
    from omegaconf import DictConfig

    calls: list[tuple[str, str, bool, bool]] = []
    state = {"depth": 0}

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        code = frame.f_code
        inside = state["depth"] > 0 or whole
        if event == "call" and code.co_name == "infer" and code.co_filename.endswith(os.path.join("flows", "infer.py")):
            state["depth"] += 1
            inside = True
        elif (
            event == "return"
            and code.co_name == "infer"
            and code.co_filename.endswith(os.path.join("flows", "infer.py"))
        ):
            state["depth"] -= 1
            return
        if event != "call" or not inside or not code.co_filename.startswith(OURS):
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        has_cfg = any(isinstance(frame.f_locals.get(n), DictConfig) for n in names)
        top = getattr(frame.f_globals.get(code.co_name), "__code__", None) is code  # a module-level function
        calls.append((os.path.relpath(code.co_filename, ROOT), code.co_name, has_cfg, top))

    del args
    with tempfile.TemporaryDirectory() as tmp:
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            from espnet3_prefect.cli import main as cli

            code = cli(
                [
                    "infer",
                    "--config",
                    str(ROOT / "recipes/dtmf/conf/inference.yaml"),
                    f"inference_dir={tmp}/inference",
                    f"data_root={ROOT}/exp/dtmf/data",
                    "parallel.n_workers=1",
                ]
            )
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    if code:
        print(f"infer exited {code}", file=sys.stderr)
        return code
    for label, picked in (
        ("all calls", calls),
        ("module-level functions", [c for c in calls if c[3]]),
        ("calls given the config", [c for c in calls if c[2]]),
    ):
        files = [c[0] for c in picked]
        steps, seen, returns = [], set(), 0
        for f in files:
            if steps and steps[-1] == f:
                continue
            if f in seen:
                returns += 1
            seen.add(f)
            steps.append(f)
        print(f"{label}: {len(picked)} calls in {len(seen)} files, {len(steps)} steps, {returns} back to a file left")
        if show:
            print("  " + " -> ".join(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
