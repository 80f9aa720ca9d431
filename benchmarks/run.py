"""The benchmark suite: every number is a ratio against a baseline measured in the same run.

    .venv/bin/python -m benchmarks.run [--quick] [--out docs/benchmarks.md] [--json results.json]

Absolute times on shared 2-core machines are noise; the ratios are what to read. Not part of the
test pass/fail. See docs/benchmarks.md for the last results and what they mean.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from . import baselines, cli_runs, mini_an4, orchestration, synthetic
from .data_groups import balance, prefetch
from .shard_time import shards_by_time

ROOT = Path(__file__).resolve().parents[1]


class Suite:
    def __init__(self, work: Path, quick: bool):
        self.work, self.quick, self.rows = work, quick, []
        self.n = 2000 if quick else 10_000
        self.server = orchestration.ServerMeter(work / "home")

    def record(self, group: str, name: str, value: float, goal: str = "", note: str = "") -> None:
        """One result, with the 1-minute load average seen when it was recorded (2 cores: above ~2.5
        other work competes with the measurement)."""
        load = os.getloadavg()[0]
        self.rows.append({"group": group, "name": name, "value": value, "goal": goal, "note": note, "load": load})
        print(f"  {group:<10} {name:<56} {value:10.3f}  {goal:<8} load {load:4.2f}  {note}", flush=True)

    def config(self, name: str, n: int, cost_ms: float, workers: int, shards: int | None) -> Path:
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(synthetic.config(str(self.work / name), n, cost_ms, workers, shards)))
        return path

    def infer(self, name: str, n: int, cost_ms: float, workers: int, shards: int | None = None) -> tuple[float, dict]:
        return self.infer_config(self.config(name, n, cost_ms, workers, shards))

    def infer_config(self, path: Path) -> tuple[float, dict]:
        from espnet3_prefect.flows.infer import infer

        started = time.perf_counter()
        [summary] = infer(config=[str(path)])
        return time.perf_counter() - started, summary

    @staticmethod
    def dropin_infer(path: Path) -> float:
        """Seconds of ``espnet3_prefect.infer(config)``, the drop-in for ESPnet3's ``infer()``."""
        from omegaconf import OmegaConf

        from espnet3_prefect import infer

        started = time.perf_counter()
        infer(OmegaConf.load(path))
        return time.perf_counter() - started

    def write_config(self, name: str, cfg: dict) -> Path:
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def stage(self, name: str, n: int, cost_ms: float, workers: int, shards: int | None):
        return self.stage_of(self.config(name, n, cost_ms, workers, shards))

    @staticmethod
    def stage_of(path: Path):
        from espnet3_prefect.config.load import load_config
        from espnet3_prefect.pipeline.stage import build_stages

        return build_stages(load_config([path]))[1][0]


COST_MS = 3.0  # the overhead benchmark: 10k items x 3 ms of CPU, 2 workers


def overhead_and_resume(s: Suite) -> None:
    """1 + 4: infer vs plain Dask vs a sequential loop (3 ms forward, 2 workers); then resume."""
    from espnet3_prefect.pipeline.plan import default_num_shards

    shards = default_num_shards(s.n, 2)
    seq = baselines.sequential(s.stage("seq", s.n, COST_MS, 1, None), s.n, s.work / "seq_out")
    dask = baselines.plain_dask(s.stage("dask", s.n, COST_MS, 2, shards), s.n, 2, shards, s.work / "dask_out")
    s.server.start()
    flow, _ = s.infer("ovh", s.n, COST_MS, 2)
    server_cpu, task_runs = s.server.stop()
    same = (
        (s.work / "dask_out/y.scp").read_bytes()
        == (s.work / "ovh/bench/y.scp").read_bytes()
        == (s.work / "seq_out/y.scp").read_bytes()
    )
    s.record("overhead", f"sequential loop, {s.n} items x {COST_MS:g} ms [s]", seq)
    s.record("overhead", f"plain Dask client.map, {shards} shards, 2 workers [s]", dask)
    s.record("overhead", "infer flow, same [s]", flow, note="outputs identical" if same else "OUTPUTS DIFFER")
    s.record("overhead", "infer / plain Dask", flow / dask, "<= 1.10")
    s.record("overhead", "plain Dask / sequential (2 workers)", dask / seq)
    s.record(
        "overhead",
        "embedded server CPU per task run of that flow [ms]",
        1000 * server_cpu / max(1, task_runs),
        "<= 20",
        f"{server_cpu:.2f} s CPU for {task_runs} task runs; the server's first flow",
    )
    from . import prefect_floor  # imports Prefect: here, where the API is set

    idle = prefect_floor.idle_rate(s.server)
    # the same flow again, on the now warm server (a kept or deploy-local server's case)
    ours = prefect_floor.metered(s.server, lambda: s.infer("ovh2", s.n, COST_MS, 2))
    s.record(
        "overhead",
        "embedded server CPU per task run, a later flow [ms]",
        1000 * ours["cpu_s"] / max(1, ours["task_runs"]),
        "<= 20",
        f"{ours['cpu_s']:.2f} s CPU for {ours['task_runs']} task runs",
    )
    bare = prefect_floor.metered(s.server, lambda: prefect_floor.bare_flow(shards, s.n * COST_MS / 1000 / shards))
    s.record(
        "overhead",
        "same server, a bare Prefect flow with as many task runs [ms]",
        1000 * bare["cpu_s"] / max(1, bare["task_runs"]),
        note=f"{bare['cpu_s']:.2f} s CPU for {bare['task_runs']} task runs (benchmarks/prefect_floor.py)",
    )
    ours_ms, bare_ms = (prefect_floor.net_ms_per_task_run(cost, idle) for cost in (ours, bare))
    s.record(
        "overhead",
        "server CPU per task run net of idle: infer / bare Prefect",
        ours_ms / bare_ms,
        note=f"{ours_ms:.1f} vs {bare_ms:.1f} ms; the idle server: {100 * idle:.2f} % of a core",
    )
    again = s.dropin_infer(s.work / "ovh.yaml")
    s.record(
        "resume",
        "re-run of the finished stage / first run",
        again / flow,
        "<= 0.03",
        "drop-in infer(config), as the CLI: answered without a flow run",
    )
    s.record("resume", "re-run of the finished stage [s]", again)
    again, summary = s.infer("ovh", s.n, COST_MS, 2)
    s.record(
        "resume",
        "re-run as a flow run (a deployment's) / first run",
        again / flow,
        note=f"{summary['shards_run']} shards run; {again:.2f} s",
    )
    first, killed, resumed = resume_after_kill(s)
    s.record(
        "resume",
        "resume after a kill at ~50% / uninterrupted run",
        resumed / first,
        note=f"{killed} shards were done at the kill",
    )


def resume_after_kill(s: Suite) -> tuple[float, int, float]:
    path = s.config("kill", s.n, COST_MS, 2, None)
    out = s.work / "kill/bench"
    code = f"from espnet3_prefect.flows.infer import infer; infer(config=[{str(path)!r}])"
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    from espnet3_prefect.pipeline.plan import default_num_shards

    half = default_num_shards(s.n, 2) // 2
    while len(list(out.glob("split.*/done"))) < half and proc.poll() is None:
        time.sleep(0.05)
    first_part = time.perf_counter() - started
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = len(list(out.glob("split.*/done")))
    resumed, _ = s.infer("kill", s.n, COST_MS, 2)
    full, _ = s.infer("kill_ref", s.n, COST_MS, 2)
    return full, killed, resumed if first_part else resumed


def cli(s: Suite) -> None:
    """1b: ``espnet3-prefect infer`` on a running server / the plain-Dask design, fresh processes in turns."""
    from espnet3_prefect.pipeline.plan import default_num_shards

    times = cli_runs.compare(s.work, s.n, default_num_shards(s.n, 2), rounds=1 if s.quick else 2)
    ours, plain = min(times["cli"]), min(times["plain"])
    s.record(
        "cli",
        "espnet3-prefect infer (fresh process, running server) / plain Dask (fresh process)",
        ours / plain,
        "<= 1.10",
        f"best of {len(times['cli'])}: {ours:.2f} s vs {plain:.2f} s; all: CLI "
        f"{', '.join(f'{t:.2f}' for t in times['cli'])}, plain {', '.join(f'{t:.2f}' for t in times['plain'])}",
    )


def scaling(s: Suite) -> None:
    """2: parallel efficiency 1 -> 2 workers (CPU-bound), and wall time vs items (linear?)."""
    one, _ = s.infer("w1", s.n, COST_MS, 1)
    two, _ = s.infer("w2", s.n, COST_MS, 2)
    s.record("scaling", "1 worker [s]", one)
    s.record("scaling", "2 workers [s]", two)
    s.record("scaling", "parallel efficiency t1 / (2 t2)", one / (2 * two), ">= 0.90")
    sizes = [1_000, 10_000] if s.quick else [1_000, 10_000, 100_000]
    base = None
    for n in sizes:
        wall, _ = s.infer(f"items{n}", n, 0.0, 2)
        base = base or wall / n
        s.record(
            "scaling",
            f"{n} items, zero-cost forward: s per item / s per item at 1k",
            (wall / n) / base,
            note=f"{wall:.2f} s",
        )


def worker_start(s: Suite) -> None:
    """8: CPU of starting 1, 2, 4 local workers (each in a fresh process, all registered): forked from
    the warm fork server, as the flows start them, vs spawned (each imports Prefect and our tasks)."""
    rounds = 1 if s.quick else 2
    cpu: dict[tuple[int, bool], list[float]] = {}
    for _ in range(rounds):  # interleaved: load from other processes falls on both alike
        for n in (1, 2, 4):
            for fork in (True, False):
                cpu.setdefault((n, fork), []).append(orchestration.measure_worker_start(n, fork)["cpu_s"])
    for n in (1, 2, 4):
        fork, spawn = min(cpu[n, True]), min(cpu[n, False])
        s.record(
            "workers",
            f"worker start CPU, {n} local worker(s), forked [s]",
            fork,
            note=f"spawned (before): {spawn:.2f} s; forked / spawned {fork / spawn:.2f}",
        )


def real_recipe(s: Suite) -> None:
    """9: mini_an4 ``infer`` + ``measure``, then ``collect_stats``, 2 workers, ours / upstream (where the
    real-ESPnet layer is)."""
    recipe = mini_an4.recipe_folder()
    if recipe is None:
        print(f"  mini_an4: skipped (no .venv-espnet or no trained recipe in ${mini_an4.WORKDIR_VAR})")
        return
    for what, goal, collect_stats in (("infer + measure", "<= 1.10", False), ("collect_stats", "", True)):
        times = mini_an4.compare(recipe, rounds=1 if s.quick else 2, collect_stats=collect_stats)
        ours, upstream = min(times["ours"]), min(times["upstream"])
        every = {side: ", ".join(f"{t:.1f}" for t in runs) for side, runs in times.items()}
        s.record(
            "mini_an4",
            f"{what}, 2 workers: espnet3-prefect / upstream",
            ours / upstream,
            goal,
            f"best of {len(times['ours'])}: {ours:.1f} s vs {upstream:.1f} s; all: ours {every['ours']}, "
            f"upstream {every['upstream']}",
        )


def throughput(s: Suite) -> None:
    """Issue 40: a real ESPnet model (mini_an4's Speech2Text), upstream's consecutive batches at 4 and
    16 against batches by duration at the same padded-seconds budgets, 2 workers
    (:mod:`benchmarks.throughput`, run in .venv-espnet)."""
    python = mini_an4.VENV / "bin" / "python"
    if not python.is_file():
        print("  throughput: skipped (no .venv-espnet: bash scripts/real_espnet_setup.sh)")
        return
    out = s.work / "throughput.json"
    cmd = [str(python), "-m", "benchmarks.throughput", "--json", str(out)] + (["--quick"] if s.quick else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # its own embedded server
    subprocess.run(cmd, cwd=ROOT, check=True, env=env)
    rows = {row["run"]: row for row in json.loads(out.read_text())["rows"]}
    for duration, upstream in (("duration_b4budget", "upstream_b4"), ("duration_b16budget", "upstream_b16")):
        d, u = rows[duration], rows[upstream]
        s.record(
            "throughput",
            f"{duration} / {upstream} wall, 2 workers",
            d["wall_s"] / u["wall_s"],
            "<= 0.60",
            f"{d['wall_s']:.1f} s vs {u['wall_s']:.1f} s; RTFx {d['rtfx']} vs {u['rtfx']}; padding efficiency "
            f"{d['padding_efficiency']} vs {u['padding_efficiency']} (goal >= 0.9); WER {d['wer']} vs {u['wer']}; "
            f"same hyps {d['same_hyps']}",
        )


def shard_count(s: Suite) -> None:
    """3: the default plan vs 1 and 10 shards per worker (2 workers, 3 ms forward)."""
    from espnet3_prefect.pipeline.plan import default_num_shards

    default = default_num_shards(s.n, 2)
    walls = {}
    for label, shards in (("1 per worker", 2), ("10 per worker", 20), (f"default ({default})", None)):
        walls[label], _ = s.infer(f"shards{shards}", s.n, COST_MS, 2, shards)
    ref = walls["1 per worker"]
    for label, wall in walls.items():
        s.record("shards", f"{label}: wall / 1-per-worker wall", wall / ref, note=f"{wall:.2f} s")


def driver_memory(s: Suite) -> None:
    """5: peak RSS of the flow process (and its workers) at 10k vs 1M items."""
    sizes = (10_000, 200_000) if s.quick else (10_000, 1_000_000)
    peaks = {n: _peak_rss(s, n) for n in sizes}
    small, big = sizes
    s.record(
        "memory",
        f"driver peak RSS at {big} / at {small} items",
        peaks[big][0] / peaks[small][0],
        "<= 1.2",
        f"{peaks[small][0]:.0f} -> {peaks[big][0]:.0f} MB",
    )
    s.record(
        "memory",
        f"worker peak RSS at {big} / at {small} items",
        peaks[big][1] / peaks[small][1],
        note=f"{peaks[small][1]:.0f} -> {peaks[big][1]:.0f} MB",
    )


def _peak_rss(s: Suite, n: int) -> tuple[float, float]:
    path = s.config(f"mem{n}", n, 0.0, 2, None)
    code = f"from benchmarks.memprobe import main; main({str(path)!r})"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


def merge_vs_cat(s: Suite) -> None:
    """6: merge of shard files / ``cat`` of the same files."""
    from espnet3_prefect.disk.concat import concat_files

    parts = []
    line = "utt%08d " + "x" * 90 + "\n"
    for i in range(200):
        part = s.work / f"merge/split.{i}.scp"
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text("".join(line % (i * 2500 + j) for j in range(2500)))
        parts.append(part)
    started = time.perf_counter()
    concat_files(parts, s.work / "merge/merged.scp")
    ours = time.perf_counter() - started
    started = time.perf_counter()
    with open(s.work / "merge/cat.scp", "wb") as out:
        subprocess.run(["cat", *map(str, parts)], stdout=out, check=True)
        cat = time.perf_counter() - started
        os.fsync(out.fileno())  # ours is durable (temp name, fsync, rename): compare like with like
    cat_synced = time.perf_counter() - started
    size_mb = (s.work / "merge/cat.scp").stat().st_size / 1e6
    s.record(
        "merge",
        f"merge / (cat + fsync) of the same 200 files ({size_mb:.0f} MB)",
        ours / cat_synced,
        "<= 1.5",
        f"{ours:.3f} s vs {cat_synced:.3f} s",
    )
    s.record("merge", "merge / plain cat (no fsync)", ours / cat, note=f"cat alone {cat:.3f} s")


def server_scale_group(s: Suite, work: Path) -> None:
    """10: SQLite, PostgreSQL, PostgreSQL + Redis with 2 API processes, each a server of its own started
    for it, side by side (:mod:`benchmarks.server_scale`); after the embedded server is gone."""
    from . import server_scale

    server_scale.run_group(work, s.quick, record=s.record)


def machine() -> str:
    import distributed
    import prefect

    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores, {mem_gb:.0f} GiB, {platform.platform()}, Python {platform.python_version()}, "
        f"prefect {prefect.__version__}, distributed {distributed.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about 1/5 of the time)")
    parser.add_argument("--out", default=None, help="also write the results table here (markdown)")
    parser.add_argument(
        "--json",
        default=None,
        help="also write the results here as JSON (machine, command, one object per row: group, name, value, goal, "
        "note, load); benchmarks/figures.py draws from numbers taken from it",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        choices=[
            "overhead",
            "cli",
            "scaling",
            "workers",
            "mini_an4",
            "shards",
            "prefetch",
            "balance",
            "shards_by_time",
            "memory",
            "merge",
            "server-scale",
            "throughput",
        ],
    )
    args = parser.parse_args()
    from espnet3_prefect.server.embedded import prefect_api

    steps = {
        "overhead": overhead_and_resume,
        "cli": cli,
        "scaling": scaling,
        "workers": worker_start,
        "mini_an4": real_recipe,
        "shards": shard_count,
        "prefetch": prefetch,
        "balance": balance,
        "shards_by_time": shards_by_time,
        "memory": driver_memory,
        "merge": merge_vs_cat,
        "throughput": throughput,
    }
    print(f"machine: {machine()}")
    work = Path(tempfile.mkdtemp(prefix="e3p-bench-"))
    try:
        with prefect_api(work / "home", ui=False):
            suite = Suite(work, args.quick)
            for name, step in steps.items():
                if args.only is None or name in args.only:
                    step(suite)
        if args.only is None or "server-scale" in args.only:
            server_scale_group(suite, work / "server-scale")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        write_table(Path(args.out), suite.rows, args)
    if args.json:
        command = (
            ["benchmarks.run"] + (["--quick"] if args.quick else []) + (["--only", *args.only] if args.only else [])
        )
        record = {"machine": machine(), "command": " ".join(command), "rows": suite.rows}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


def write_table(path: Path, rows: list[dict], args) -> None:
    lines = [
        f"Machine: {machine()}",
        f"Command: `.venv/bin/python -m benchmarks.run"
        f"{' --quick' if args.quick else ''}{' --only ' + ' '.join(args.only) if args.only else ''}`",
        "",
        "| group | measure | value | goal | load avg | note |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['group']} | {r['name']} | {r['value']:.3f} | {r['goal']} | {r['load']:.2f} | {r['note']} |" for r in rows
    ]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
