"""Where the seconds of one short ``infer`` run go, from the process's start to its exit (issue 49, item 4).

    .venv/bin/python -m benchmarks.run_phases [--n 10000] [--cost-ms 3] [--rounds 1] [--keep WORK]
    .venv/bin/python -m benchmarks.run_phases --demo      # the demo's ``espnet3-prefect infer`` (a re-run if done)

Each run is a fresh process (the parent notes the monotonic clock before it spawns the child and once
the child has exited; the clock is the machine's, so the child's stamps line up with the parent's).
The child wraps the functions a run passes through with time stamps (nothing else changes) and runs
the drop-in ``espnet3_prefect.infer(config)`` on the synthetic recipe (``--rounds`` flows, the first
one starting the embedded server), or with ``--demo`` the CLI's ``main`` on the demo's config. One
table per run: phase, start and seconds, in the order the phases began (nested phases indented).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPANS: list[tuple[str, float, float, int]] = []
_DEPTH = [0]

# (module, attribute, phase name, kind): "call" stamps a call, "cm" stamps a context manager's
# enter and exit, "first" only the first call
WRAPPED = [
    ("espnet3_prefect.entry", "plan_infer", "config + plan (plan_run, preflight)", "call"),
    ("espnet3_prefect.entry", "_settled", "done markers checked (plan.complete)", "call"),
    ("espnet3_prefect.flows.workers", "fork_server_beside", "fork server started (beside the server)", "call"),
    ("espnet3_prefect.server.embedded", "prefect_api", "Prefect API", "cm"),
    ("espnet3_prefect.server.embedded", "running_server", "server: find a running one", "call"),
    ("espnet3_prefect.server.embedded", "_report_left_over", "server: servers left over", "call"),
    ("espnet3_prefect.server.embedded", "start_recorded", "server start (until healthy)", "call"),
    ("espnet3_prefect.server.auth", "server_client", "server: client credentials", "call"),
    ("espnet3_prefect.server.embedded", "_flush_prefect", "flush this process's logs and events", "call"),
    ("espnet3_prefect.server.embedded", "_stop", "server stop", "call"),
    ("espnet3_prefect.server.watch.ServerWatch", "start", "server watch start", "call"),
    ("espnet3_prefect.server.watch.ServerWatch", "stop", "server watch stop", "call"),
    # imported once the API is set (they import prefect): wrapped then
    ("espnet3_prefect.flows.infer", "quiet_console", "flow body starts", "call"),
    ("espnet3_prefect.flows.infer.infer", "fn", "flow function (body)", "call"),
    ("espnet3_prefect.flows.infer", "infer", "flow call (Prefect's engine around the body)", "call"),
    ("espnet3_prefect.flows.infer", "take_run_lock", "run lock", "call"),
    ("espnet3_prefect.flows.infer", "_run_stages", "stages", "call"),
    ("espnet3_prefect.flows.infer", "open_task_runner", "cluster", "cm"),
    ("espnet3_prefect.flows.infer", "drive_stage", "stage driven", "call"),
    ("espnet3_prefect.flows.infer", "publish_summary", "summary artifact", "call"),
    ("espnet3_prefect.flows.infer", "_warm_summary", "summary chart warm-up (beside the shards)", "call"),
    ("espnet3_prefect.flows.dispatch.DaskExecutor", "build_env", "build-env task", "call"),
    ("espnet3_prefect.flows.dispatch.DaskExecutor", "run_shards", "shards", "call"),
    ("espnet3_prefect.flows.dispatch.DaskExecutor", "merge", "merge task", "call"),
    ("espnet3_prefect.flows.dispatch.DaskExecutor", "__exit__", "executor exit (cluster close + record)", "call"),
    ("espnet3_prefect.flows.dispatch", "wait_until_recorded", "wait for the recorder", "call"),
    ("espnet3_prefect.execution.worker_watch.NoWorkers", "__exit__", "no-worker watch stop", "call"),
    ("espnet3_prefect.execution.worker_watch.LostWorkers", "__exit__", "lost-worker watch stop", "call"),
    ("espnet3_prefect.execution.task_runner.ShardTaskRunner", "__exit__", "task runner exit (workers drain)", "call"),
    ("espnet3_prefect.execution.task_runner.ShardTaskRunner", "__enter__", "task runner start", "call"),
]


def _stamp(name: str, start: float, depth: int) -> None:
    SPANS.append((name, start, time.monotonic(), depth))


def _call(fn, name):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start, depth = time.monotonic(), _DEPTH[0]
        _DEPTH[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            _stamp(name, start, depth)

    return wrapper


def _cm(fn, name):
    @functools.wraps(fn)
    @contextlib.contextmanager
    def wrapper(*args, **kwargs):
        start, depth = time.monotonic(), _DEPTH[0]
        _DEPTH[0] += 1
        manager = fn(*args, **kwargs)
        try:
            value = manager.__enter__()
        finally:
            _stamp(f"{name}: enter", start, depth + 1)
        inside = time.monotonic()
        try:
            yield value
        except BaseException:
            leaving = time.monotonic()
            if not manager.__exit__(*sys.exc_info()):
                raise
        else:
            leaving = time.monotonic()
            manager.__exit__(None, None, None)
        finally:
            _stamp(f"{name}: inside", inside, depth + 1)
            _stamp(f"{name}: exit", leaving, depth + 1)
            _DEPTH[0] -= 1
            _stamp(name, start, depth)

    return wrapper


LATE = next(i for i, w in enumerate(WRAPPED) if w[0] == "espnet3_prefect.flows.infer")


def instrument(wrapped: list) -> None:
    for path, attr, name, kind in wrapped:
        module_name, owner = path, None
        try:
            module = importlib.import_module(path)
        except ImportError:
            module_name, _, owner = path.rpartition(".")
            module = importlib.import_module(module_name)
        target = getattr(module, owner) if owner else module
        fn = getattr(target, attr, None)
        if fn is None:  # not in this version of the code (the "before" side of a comparison)
            continue
        setattr(target, attr, (_cm if kind == "cm" else _call)(fn, name))


def _after_api_set() -> None:
    """Wrap the modules that import prefect once the first API is entered (as the front doors import them)."""
    import espnet3_prefect.server.embedded as embedded

    wrapped = embedded.prefect_api

    @contextlib.contextmanager
    def api(*args, **kwargs):
        with wrapped(*args, **kwargs) as url:
            if "espnet3_prefect.flows.infer" not in sys.modules or not LATE_DONE:
                LATE_DONE.append(1)
                instrument(WRAPPED[LATE:])
            yield url

    embedded.prefect_api = api


LATE_DONE: list = []


def sample_main_thread(out: list, spawned: float, every_s: float = 0.005) -> None:
    """Sample the main thread's stack every ``every_s`` (``--samples``): ``(time, [frames, innermost last])``."""
    import threading
    import traceback

    main_id = threading.main_thread().ident

    def sample() -> None:
        while True:
            frame = sys._current_frames().get(main_id)
            if frame is not None:
                stack = traceback.extract_stack(frame)
                out.append(
                    (time.monotonic() - spawned, [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in stack])
                )
            time.sleep(every_s)

    threading.Thread(target=sample, name="phase-sampler", daemon=True).start()


def _rounds(args: argparse.Namespace, infer) -> None:
    import yaml
    from omegaconf import OmegaConf

    from benchmarks import synthetic

    for rnd in range(args.rounds):
        path = Path(args.work) / f"infer{rnd}.yaml"
        path.write_text(
            yaml.safe_dump(synthetic.config(str(Path(args.work) / f"infer{rnd}"), args.n, args.cost_ms, 2, None))
        )
        started = time.monotonic()
        infer(OmegaConf.load(path))
        _stamp(f"infer() round {rnd}", started, 0)


def child(args: argparse.Namespace) -> None:
    SPANS.append(("interpreter up (python startup, site, .pth files)", args.spawned, time.monotonic(), 0))
    started = time.monotonic()
    import espnet3_prefect  # noqa: F401 - what every front door imports first
    import espnet3_prefect.cli  # noqa: F401

    _stamp("import espnet3_prefect (+ cli)", started, 0)
    started = time.monotonic()
    samples: list = []
    if args.samples:
        sample_main_thread(samples, args.spawned)
        import atexit

        # registered first, so it runs last: the samples of the other exit hooks are in the file
        atexit.register(lambda: Path(args.samples).write_text(json.dumps(samples)))
    instrument(WRAPPED[:LATE])
    _after_api_set()
    _stamp("(instrumenting: the benchmark's own cost)", started, 0)
    if args.demo:
        from espnet3_prefect.cli import main

        started = time.monotonic()
        status = main(["infer", "--config", "recipes/dtmf/conf/inference.yaml"])
        _stamp(f"cli main (exit status {status})", started, 0)
    else:
        import espnet3_prefect.server.embedded as embedded
        from espnet3_prefect import infer

        # --one-server: every round on one server started first (later rounds: a kept server's case)
        outer = embedded.prefect_api(ui=False) if args.one_server else contextlib.nullcontext()
        with outer:
            _rounds(args, infer)
    SPANS.append(("main returns", time.monotonic(), time.monotonic(), 0))
    if args.samples:  # which threads the interpreter's exit may wait for
        import threading

        frames = sys._current_frames()
        for thread in threading.enumerate():
            frame = frames.get(thread.ident)
            where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}" if frame else "?"
            print(f"thread at exit: {thread.name} daemon={thread.daemon} {where}", file=sys.stderr)
    print("SPANS " + json.dumps(SPANS), flush=True)
    sys.stdout.flush()


def explain(path: str, start: float, end: float, top: int = 25) -> str:
    """Where the main thread was between ``start`` and ``end`` (seconds after the spawn), from the
    samples of ``--samples``: each frame's share of the samples (counted once per sample), most first."""
    import collections

    samples = [stack for t, stack in json.loads(Path(path).read_text()) if start <= t <= end]
    counts: collections.Counter = collections.Counter()
    for stack in samples:
        counts.update(set(stack))
    lines = [f"{len(samples)} samples in [{start:g}, {end:g}] s"]
    lines += [f"{100 * n / max(1, len(samples)):5.1f} %  {frame}" for frame, n in counts.most_common(top)]
    return "\n".join(lines)


def table(spans: list, spawned: float, exited: float) -> str:
    rows = [("phase", "start s", "seconds")]
    for name, start, end, depth in sorted(spans, key=lambda s: (s[1], s[3])):
        rows.append(("  " * depth + name, f"{start - spawned:7.2f}", f"{end - start:7.2f}"))
    last = max(end for _, _, end, _ in spans)
    rows.append(
        (
            "process exit (atexit hooks, threads, interpreter teardown)",
            f"{last - spawned:7.2f}",
            f"{exited - last:7.2f}",
        )
    )
    rows.append(("TOTAL (spawn to exit)", f"{0:7.2f}", f"{exited - spawned:7.2f}"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{r[0]:<{width}}  {r[1]:>8}  {r[2]:>8}" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--cost-ms", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--one-server", action="store_true", help="every round on one server started first")
    parser.add_argument("--demo", action="store_true", help="the demo's espnet3-prefect infer instead")
    parser.add_argument("--json", action="store_true", help="one JSON line (the spans) instead of the table")
    parser.add_argument("--samples", default=None, help="write the main thread's stack samples (JSON) here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--explain", nargs=3, metavar=("SAMPLES", "START", "END"), help="read samples: where the main thread was"
    )
    args = parser.parse_args()
    if args.explain:
        return print(explain(args.explain[0], float(args.explain[1]), float(args.explain[2])))
    if args.child:
        return child(args)
    work = tempfile.mkdtemp(prefix="e3p-phases-")
    env = dict(os.environ)
    env.setdefault("ESPNET3_PREFECT_HOME", str(Path(work) / "home"))  # a server of its own, not the project's
    spawned = time.monotonic()
    argv = [sys.executable, "-m", "benchmarks.run_phases", "--child", "--spawned", repr(spawned), "--work", work]
    argv += ["--n", str(args.n), "--cost-ms", str(args.cost_ms), "--rounds", str(args.rounds)]
    argv += ["--demo"] if args.demo else []
    argv += ["--one-server"] if args.one_server else []
    argv += ["--samples", str(Path(args.samples).resolve())] if args.samples else []
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    exited = time.monotonic()
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SPANS ")), None)
    if args.samples:
        print("\n".join(ln for ln in proc.stderr.splitlines() if ln.startswith("thread at exit")), file=sys.stderr)
    if line is None:
        sys.exit(f"no spans (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    spans = json.loads(line[len("SPANS ") :])
    if args.json:
        print(json.dumps({"spawned": spawned, "exited": exited, "spans": spans}))
    else:
        print(table(spans, spawned, exited))


if __name__ == "__main__":
    main()
