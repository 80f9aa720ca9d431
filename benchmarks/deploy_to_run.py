"""Time from `deploy` to a finished `infer/local` run, on a fresh copy of the project.

    .venv/bin/python -m benchmarks.deploy_to_run [--prepared-data] [--runs 2]

Copies prefect.yaml, flows/, recipes/, deployments/ into a temp folder (no demo data: the flow
generates it unless --prepared-data), runs `espnet3-prefect deploy-local` there (server + process
pool + `prefect deploy --all` + worker, free 127.0.0.1 port), then `prefect deployment run
infer/local --watch` --runs times (the first computes, later ones are answered from the shard
cache), and stops everything. Prints each phase in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepared-data", action="store_true", help="generate the demo audio before deploying")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    from espnet3_prefect.server.process import free_port

    cli = [sys.executable, "-m", "espnet3_prefect.cli"]
    prefect = str(Path(sys.executable).with_name("prefect"))
    with tempfile.TemporaryDirectory(prefix="e3p-bench-") as tmp:
        project, home = Path(tmp) / "project", Path(tmp) / "home"
        project.mkdir()
        shutil.copy(ROOT / "prefect.yaml", project)
        for folder in ("flows", "recipes", "deployments"):
            shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["ESPNET3_PREFECT_HOME"] = str(home)
        if args.prepared_data:
            subprocess.run(
                [sys.executable, "-m", "dtmf_demo.recipe", "--data-root", "exp/dtmf/data"],
                cwd=project,
                check=True,
                capture_output=True,
            )
        started = time.monotonic()
        try:
            subprocess.run(
                [*cli, "deploy-local", "--port", str(free_port()), "--project-dir", str(project)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            )
            deployed = time.monotonic()
            state = json.loads((home / "deploy-local.json").read_text())
            env.update(PREFECT_API_URL=state["api_url"], PREFECT_HOME=str(home / "client_home"))
            print(f"deploy-local: {deployed - started:.1f} s {state['timings']}")
            for i in range(args.runs):
                t0 = time.monotonic()
                subprocess.run(
                    [prefect, "deployment", "run", "infer/local", "--watch", "--watch-interval", "1"],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                now = time.monotonic()
                print(f"infer/local run {i + 1}: {now - t0:.1f} s (deploy start -> finished: {now - started:.1f} s)")
        finally:
            subprocess.run([*cli, "deploy-local", "--stop"], env=env, capture_output=True, timeout=120)


if __name__ == "__main__":
    main()
