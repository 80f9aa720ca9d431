"""Server outage: how a run outlives a Prefect server that is not its own (``PREFECT_API_URL``), by
outage length x server kind (issue 48).

    .venv/bin/python -m benchmarks.server_outage [--rows all|quick] [--four]

Each row: a fresh server on 127.0.0.1 (a free port), one toy ``espnet3-prefect infer`` run against it
(160 items, 40 shards, 2 workers, 0.15 s an item: ~12 s of work), the server taken down once 4 shards
are done, started again on the same port after the outage, the run waited for; then the server polled
every 0.5 s (up to 120 s) for the run's record. Server kinds:

- ``sqlite``: a lab's SQLite server (:func:`espnet3_prefect.server.process.start_server`), SIGKILLed
  (process group), started again;
- ``postgres``: the same on PostgreSQL (a fresh database of a private cluster,
  :mod:`tests.helpers.postgres`), stopped gracefully (:func:`~espnet3_prefect.server.process.stop_server`);
- ``split-api``: the split server (:mod:`espnet3_prefect.server.split`) with 2 API processes on
  PostgreSQL + Redis; only its API processes are stopped (gracefully) and started again, the services
  and Redis stay up;
- ``split-all``: the same split server stopped whole (API, services with SIGINT, Redis: ``SplitServer.stop``)
  and started whole again (Redis reads its append-only file back, on a new port).

Reported per row: the run's exit code, its output against the expected toy output, the one-line
notices on stderr (``is unreachable since`` / ``answers again``), seconds from the server's restart
(healthy again) to the run's end, the shard task runs the server holds Completed (of 40) and the flow
run's state 120 s after the run's end at most, and seconds from the run's end until all 40 are
Completed. One more row: an outage (40 s) longer than ``parallel.api_outage_s`` (20 s), where the run
must end exit 1 on one line; then a re-run against the restarted server.

``--four``: four 500-shard toy runs (2,000 items, 2 workers each) started at once against a stock
``prefect server start`` (SQLite, its own PREFECT_HOME): exit codes, wall times, shard task runs the
server holds Completed 60 s after the last run ended (of 2,000). Bounded at 15 minutes.

``--rows quick``: the 15-s rows only. Writes the table to benchmarks/results/server_outage.md with
the date, the machine and the commit. Every process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N_ITEMS, N_SHARDS, SLEEP_S = 160, 40, 0.15
EXPECTED = "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(N_ITEMS))
CATCH_UP_LIMIT_S, POLL_S = 120.0, 0.5
FOUR_LIMIT_S = 15 * 60
RESULTS = ROOT / "benchmarks" / "results" / "server_outage.md"
KINDS = {
    "sqlite": "lab SQLite (SIGKILL, restart)",
    "postgres": "PostgreSQL (graceful stop, start)",
    "split-api": "split: 2 API on PostgreSQL + Redis (API stopped, started)",
    "split-all": "split: 2 API on PostgreSQL + Redis (API, services, Redis stopped, started)",
}


# ----------------------------------------------------------------------------- http
def post(api_url: str, path: str, body: dict, timeout_s: float = 30):
    request = urllib.request.Request(
        f"{api_url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        return json.load(resp)


def shard_record(api_url: str) -> dict:
    """What the server holds: per flow run its state and its shard task runs (Completed, all)."""
    runs = post(api_url, "flow_runs/filter", {"limit": 50})
    out = {"flows": [], "completed_names": set(), "shard_rows": 0}
    for run in runs:
        offset, task_runs = 0, []
        while True:
            page = post(
                api_url,
                "task_runs/filter",
                {
                    "flow_runs": {"id": {"any_": [run["id"]]}},
                    "task_runs": {"name": {"like_": "run-shard-"}},
                    "limit": 200,
                    "offset": offset,
                },
            )
            task_runs += page
            if len(page) < 200:
                break
            offset += 200
        shards = [t for t in task_runs if t["name"].startswith("run-shard-")]
        done = {t["name"] for t in shards if t["state_type"] == "COMPLETED"}
        out["flows"].append(
            {"id": run["id"], "state": run["state_type"], "shards": len(shards), "completed": len(done)}
        )
        out["completed_names"] |= done
        out["shard_rows"] += len(shards)
    return out


# ----------------------------------------------------------------------------- servers
# the servers of the rows: tests/helpers/lab_server.py (the integration tests restart the same kinds)
from tests.helpers.lab_server import LabServer as Server  # noqa: E402


# ----------------------------------------------------------------------------- runs
def write_config(
    folder: Path,
    api_outage_s: float | None = None,
    n: int = N_ITEMS,
    shards: int = N_SHARDS,
    sleep_s: float | None = SLEEP_S,
) -> Path:
    from tests.conftest import toy_config, write_yaml

    cfg = toy_config(folder, n=n, num_shards=shards, n_workers=2)
    if sleep_s is not None:
        cfg["model"]["sleep_s"] = sleep_s
    if api_outage_s is not None:
        cfg["parallel"]["api_outage_s"] = api_outage_s
    return write_yaml(folder / "inference.yaml", cfg)


def start_run(folder: Path, config: Path, api_url: str, tag: str = "run") -> subprocess.Popen:
    """``espnet3-prefect infer`` in its own session; stdout and stderr to files (no pipe to fill)."""
    from tests.helpers.procs import CLI, cli_env

    env = {**cli_env(folder / "home"), "PREFECT_API_URL": api_url}
    with open(folder / f"{tag}.out", "wb") as out, open(folder / f"{tag}.err", "wb") as err:
        return subprocess.Popen(
            [*CLI, "infer", "--config", str(config)],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def kill_run(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)


def done_count(out: Path) -> int:
    return len(list(out.glob("split.*/done")))


def stderr_facts(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.strip()]
    return {
        "unreachable": text.count("is unreachable since"),
        "answers_again": text.count("answers again"),
        "noise": sum(text.count(n) for n in ("--- Error logging to API ---", "failed to process item", "Traceback")),
        "lines": len(lines),
        "from_markers": sum(
            int(m.group(1)) for m in re.finditer(r"recorded (\d+) shard\(s\) from their done markers", text)
        ),
        "last": lines[-1] if lines else "",
        "tail": "\n".join(text.splitlines()[-25:]),
    }


def catch_up(api_url: str, ended: float, want: int) -> dict:
    """Poll every 0.5 s (up to 120 s after ``ended``) until ``want`` shards are Completed and every
    flow run is final; seconds from ``ended`` to each."""
    t_shards = t_flow = None
    record = None
    while True:
        try:
            record = shard_record(api_url)
        except Exception as exc:  # noqa: BLE001 (a server still starting: keep polling)
            record = record or {"flows": [], "completed_names": set(), "shard_rows": 0, "error": repr(exc)}
        now = time.monotonic() - ended
        if t_shards is None and len(record["completed_names"]) >= want:
            t_shards = now
        if (
            t_flow is None
            and record["flows"]
            and all(f["state"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for f in record["flows"])
        ):
            t_flow = now
        if (t_shards is not None and t_flow is not None) or now > CATCH_UP_LIMIT_S:
            break
        time.sleep(POLL_S)
    return {"record": record, "t_shards": t_shards, "t_flow": t_flow}


def outage_row(kind: str, gap_s: float, work: Path) -> dict:
    """One row: run, server down after 4 shards, ``gap_s`` later up again, the run and its record."""
    work.mkdir(parents=True, exist_ok=True)
    row = {"kind": kind, "gap_s": gap_s}
    server = proc = None
    try:
        server = Server(kind, work)
        out = work / "inference/test_a"
        proc = start_run(work, write_config(work), server.url)
        t0 = time.monotonic()
        row["done_at_down"] = wait_for_shards(out, proc, 4)
        t_down = time.monotonic()
        server.down()
        row["stop_s"] = time.monotonic() - t_down
        time.sleep(max(0.0, gap_s - row["stop_s"]))
        row["running_at_up"] = proc.poll() is None
        row["done_at_up"] = done_count(out)
        t_restart = time.monotonic()
        server.up()
        t_up = time.monotonic()
        row["start_s"] = t_up - t_restart
        row["down_s"] = t_up - t_down  # the server out: from the kill/stop until healthy again
        proc.wait(timeout=900 + 300)
        ended = time.monotonic()
        row["rc"] = proc.returncode
        row["run_s"] = ended - t0
        row["up_to_end_s"] = ended - t_up
        y = out / "y.scp"
        row["output_ok"] = y.exists() and y.read_text() == EXPECTED
        row["stderr"] = stderr_facts((work / "run.err").read_text(errors="replace"))
        row.update(catch_up(server.url, ended, N_SHARDS))
    except Exception as exc:  # noqa: BLE001 (a row that fails is reported, the others still run)
        row["error"] = repr(exc)
        if (work / "run.err").exists():
            row["stderr"] = stderr_facts((work / "run.err").read_text(errors="replace"))
    finally:
        kill_run(proc)
        if server is not None:
            server.close()
    return row


def wait_for_shards(out: Path, proc, n: int, timeout_s: float = 300) -> int:
    """Wait until ``n`` shards under ``out`` are done (or the run ended, or ``timeout_s``); how many are."""
    started = time.monotonic()
    while done_count(out) < n and proc.poll() is None and time.monotonic() - started < timeout_s:
        time.sleep(0.05)
    return done_count(out)


def past_outage_row(work: Path, api_outage_s: float = 20.0, gap_s: float = 40.0) -> dict:
    """An outage (SQLite, SIGKILL) longer than ``parallel.api_outage_s``: the run ends exit 1 on one
    line; after the restart a re-run completes."""
    work.mkdir(parents=True, exist_ok=True)
    row = {"kind": "sqlite", "gap_s": gap_s, "api_outage_s": api_outage_s}
    server = proc = rerun = None
    try:
        server = Server("sqlite", work)
        out = work / "inference/test_a"
        config = write_config(work, api_outage_s=api_outage_s)
        proc = start_run(work, config, server.url)
        row["done_at_down"] = wait_for_shards(out, proc, 4)
        t_down = time.monotonic()
        server.down()
        while proc.poll() is None and time.monotonic() - t_down < gap_s:
            time.sleep(0.1)
        row["rc"] = proc.poll()
        row["ended_after_down_s"] = time.monotonic() - t_down if proc.poll() is not None else None
        row["done_at_end"] = done_count(out)
        row["stderr"] = stderr_facts((work / "run.err").read_text(errors="replace"))
        time.sleep(max(0.0, gap_s - (time.monotonic() - t_down)))
        if proc.poll() is None:  # still running at the restart: not what is expected; see what it does
            row["running_at_up"] = True
        server.up()
        row["down_s"] = time.monotonic() - t_down
        if proc.poll() is None:
            proc.wait(timeout=600)
            row["rc"] = proc.returncode
            row["stderr"] = stderr_facts((work / "run.err").read_text(errors="replace"))
        t1 = time.monotonic()
        rerun = start_run(work, config, server.url, tag="rerun")
        rerun.wait(timeout=600)
        ended = time.monotonic()
        row["rerun_rc"] = rerun.returncode
        row["rerun_s"] = ended - t1
        row["rerun_stdout_last"] = ((work / "rerun.out").read_text(errors="replace").strip().splitlines() or [""])[-1]
        row["rerun_stderr"] = stderr_facts((work / "rerun.err").read_text(errors="replace"))
        y = out / "y.scp"
        row["output_ok"] = y.exists() and y.read_text() == EXPECTED
        row.update(catch_up(server.url, ended, N_SHARDS))
    except Exception as exc:  # noqa: BLE001
        row["error"] = repr(exc)
    finally:
        kill_run(proc)
        kill_run(rerun)
        if server is not None:
            server.close()
    return row


# ----------------------------------------------------------------------------- four at once
def four_runs(work: Path, n_runs: int = 4, shards: int = 500) -> dict:
    """``n_runs`` runs of ``shards`` shards at once against a stock ``prefect server start`` (SQLite)."""
    from espnet3_prefect.server.process import free_port, healthy

    work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + FOUR_LIMIT_S
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(work / "prefect_home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    result = {"runs": [], "url": url}
    procs: list[subprocess.Popen] = []
    server = None
    try:
        with open(work / "server.log", "wb") as log:
            server = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("prefect")),
                    "server",
                    "start",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        t_start = time.monotonic()
        while not healthy(url) and time.monotonic() - t_start < 180:
            if server.poll() is not None:
                raise RuntimeError(f"prefect server start exited {server.returncode}; see {work / 'server.log'}")
            time.sleep(0.5)
        result["server_start_s"] = time.monotonic() - t_start
        folders = [work / f"run{i}" for i in range(n_runs)]
        configs = []
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            configs.append(write_config(folder, n=4 * shards, shards=shards, sleep_s=None))
        starts = []
        for folder, config in zip(folders, configs):
            starts.append(time.monotonic())
            procs.append(start_run(folder, config, url))
        ends: list[float | None] = [None] * n_runs
        while any(e is None for e in ends) and time.monotonic() < deadline - 70:
            for i, proc in enumerate(procs):
                if ends[i] is None and proc.poll() is not None:
                    ends[i] = time.monotonic()
            time.sleep(0.5)
        for i, (proc, folder) in enumerate(zip(procs, folders)):
            err = (folder / "run.err").read_text(errors="replace")
            out = (folder / "run.out").read_text(errors="replace")
            result["runs"].append(
                {
                    "rc": proc.poll(),
                    "wall_s": (ends[i] - starts[i]) if ends[i] else None,
                    "summary": next((line for line in out.splitlines() if "items," in line), ""),
                    "stderr": stderr_facts(err),
                    "errors_503": len(re.findall(r"\b503 Service Unavailable|\bstatus(?: code)? 503\b", err)),
                    "output_lines": len((folder / "inference/test_a/y.scp").read_text().splitlines())
                    if (folder / "inference/test_a/y.scp").exists()
                    else None,
                }
            )
        finished = [e for e in ends if e is not None]
        if finished:
            last = max(finished)
            time.sleep(max(0.0, min(60 - (time.monotonic() - last), deadline - time.monotonic())))
            result["after_last_s"] = time.monotonic() - last
        count = post(
            url,
            "task_runs/count",
            {"task_runs": {"name": {"like_": "run-shard-"}, "state": {"type": {"any_": ["COMPLETED"]}}}},
            timeout_s=120,
        )
        result["completed"] = int(count)
        result["shard_rows"] = int(
            post(url, "task_runs/count", {"task_runs": {"name": {"like_": "run-shard-"}}}, timeout_s=120)
        )
        flows = post(url, "flow_runs/filter", {"limit": 50})
        result["flows"] = sorted(f["state_type"] for f in flows)
        log_text = (work / "server.log").read_text(errors="replace")
        result["server_log"] = {
            "database is locked": log_text.count("database is locked"),
            "503": log_text.count(" 503"),
        }
    except Exception as exc:  # noqa: BLE001
        result["error"] = repr(exc)
    finally:
        for proc in procs:
            kill_run(proc)
        if server is not None and server.poll() is None:
            from espnet3_prefect._internal.proc import stop_group

            stop_group(server.pid, 30)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(30)
    return result


# ----------------------------------------------------------------------------- table
def _s(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def row_line(row: dict) -> str:
    label = KINDS[row["kind"]]
    if "error" in row:
        return f"| {label} | {row['gap_s']:g} | ERROR: {row['error'][:200]} | | | | | | | |"
    rec = row["record"]
    flows = ", ".join(f["state"] for f in rec["flows"]) or "none"
    err = row["stderr"]
    notices = f"{err['unreachable']} / {err['answers_again']}" + (f", noise {err['noise']}" if err["noise"] else "")
    return (
        f"| {label} | {row['gap_s']:g} (down {row['down_s']:.1f}) | {row['rc']} | "
        f"{'identical' if row['output_ok'] else 'DIFFERENT'} | {notices} | "
        f"{'yes' if row['running_at_up'] else 'no'} ({row['done_at_up']}/40 done) | {_s(row['up_to_end_s'])} | "
        f"{len(rec['completed_names'])}/40 ({rec['shard_rows']} rows), {flows} | "
        f"{_s(row['t_shards'])} / {_s(row['t_flow'])} | {err['from_markers']} |"
    )


def past_outage_lines(row: dict) -> list[str]:
    if "error" in row:
        return [f"Outage past `parallel.api_outage_s`: ERROR {row['error']}"]
    rec = row["record"]
    err, rerr = row["stderr"], row["rerun_stderr"]
    flows = "; ".join(f"{f['state']} {f['completed']}/{f['shards']} shards Completed" for f in rec["flows"])
    return [
        f"Outage past `parallel.api_outage_s` (lab SQLite, SIGKILL; `api_outage_s: {row['api_outage_s']:g}`, "
        f"{row['gap_s']:g}-s outage, server down {row['down_s']:.1f} s):",
        "",
        f"- first run: exit {row['rc']}, ended {_s(row['ended_after_down_s'])} s after the kill, "
        f"{row['done_at_end']}/40 shards done; stderr {err['lines']} non-empty line(s), the last: `{err['last']}`",
        f"- re-run after the restart: exit {row['rerun_rc']} in {row['rerun_s']:.1f} s "
        f"(`{row['rerun_stdout_last']}`), output {'identical' if row['output_ok'] else 'DIFFERENT'}, "
        f"stderr {rerr['lines']} non-empty line(s)",
        f"- record: {len(rec['completed_names'])}/40 distinct shards Completed over the flow runs "
        f"({flows}); all 40 at {_s(row['t_shards'])} s after the re-run's end, every flow run final at "
        f"{_s(row['t_flow'])} s",
    ]


def four_lines(result: dict) -> list[str]:
    lines = ["", "## Four 500-shard runs at once, stock `prefect server start` (SQLite)", ""]
    if "error" in result:
        lines.append(f"ERROR: {result['error']}")
    lines += ["| run | exit | wall s | summary | stderr lines | 503 answers on stderr |", "|---|---|---|---|---|---|"]
    for i, run in enumerate(result["runs"]):
        lines.append(
            f"| {i} | {run['rc']} | {_s(run['wall_s'])} | {run['summary']} | {run['stderr']['lines']} "
            f"| {run['errors_503']} |"
        )
    if "completed" in result:
        lines += [
            "",
            f"Shard task runs Completed on the server {_s(result.get('after_last_s'))} s after the last run "
            f"ended: {result['completed']} / {4 * 500} ({result['shard_rows']} shard task runs in all); flow runs: "
            f"{', '.join(result['flows'])}; server log: {result['server_log']}.",
        ]
    return lines


def machine() -> str:
    free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.strip("\n")
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "--no-optional-locks", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    return (
        f"{datetime.datetime.now().isoformat(timespec='minutes')}; commit {head}"
        f"{' with uncommitted changes' if dirty else ''}; nproc {os.cpu_count()}; "
        f"load average at the start {load[0]:.1f}; free -g:\n\n```\n{free}\n```"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", choices=("all", "quick", "none"), default="all")
    parser.add_argument("--four", action="store_true", help="also four 500-shard runs at once on a stock server")
    parser.add_argument("--kinds", default="sqlite,postgres,split-api,split-all")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    header = machine()
    work = Path(tempfile.mkdtemp(prefix="e3p-outage-"))
    work.chmod(0o755)
    os.environ["ESPNET3_PREFECT_REGISTRY"] = str(work / "registry")  # the servers it starts: not the user's list
    kinds = args.kinds.split(",")
    plan = []
    if args.rows != "none":
        for gap in (15.0, 120.0) if args.rows == "all" else (15.0,):
            for kind in kinds:
                if kind == "split-all" and gap > 15:
                    continue  # one row of a whole split server's restart
                plan.append((kind, gap))
    rows, past, four = [], None, None

    def render() -> str:
        lines = ["# Server outage (issue 48)", "", header, ""]
        if rows:
            lines += [
                "| server | outage s (down s) | exit | output | notices unreachable / answers again "
                "| running at restart | restart to run end s | Completed shards / 40, flow run "
                "| catch-up s: 40 Completed / flow final "
                "| shards the run recorded from done markers |",
                "|---|---|---|---|---|---|---|---|---|---|",
                *(row_line(r) for r in rows),
            ]
        if past is not None:
            lines += ["", *past_outage_lines(past)]
        if four is not None:
            lines += four_lines(four)
        text = "\n".join(lines) + "\n"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        return text

    try:
        for i, (kind, gap) in enumerate(plan):
            print(f"[{time.strftime('%H:%M:%S')}] {kind}, {gap:g}-s outage", flush=True)
            row = outage_row(kind, gap, work / f"row{i}_{kind}_{gap:g}")
            rows.append(row)
            render()
            print(row_line(row), flush=True)
            if "error" in row or row.get("rc") != 0 or len(row["record"]["completed_names"]) != N_SHARDS:
                print(row.get("stderr", {}).get("tail", ""), flush=True)
        if args.rows == "all":
            print(f"[{time.strftime('%H:%M:%S')}] outage past api_outage_s", flush=True)
            past = past_outage_row(work / "past_outage")
            render()
            print("\n".join(past_outage_lines(past)), flush=True)
            print(past.get("stderr", {}).get("tail", ""), flush=True)
        if args.four:
            print(f"[{time.strftime('%H:%M:%S')}] four 500-shard runs at once", flush=True)
            four = four_runs(work / "four")
            print("\n".join(four_lines(four)), flush=True)
    finally:
        with contextlib.suppress(Exception):
            from tests.helpers import postgres

            postgres.shutdown()
    print("\n" + render())
    print(f"work folder (kept for the logs): {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
