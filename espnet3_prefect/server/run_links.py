"""Links to the flow runs a project recorded: which runs wrote a stage's outputs (their ids are in the
shards' ``done`` markers) and the project's recent runs, read from its Prefect server
(``espnet3-prefect ui``, ``--keep-server`` on a finished stage)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from espnet3_prefect.disk.layout import DONE_NAME
from espnet3_prefect.disk.marker import read_marker


class RunLink(NamedTuple):
    id: str
    flow: str
    name: str
    state: str
    started: str

    def line(self, ui_url: str) -> str:
        return f"  {run_url(ui_url, self.id)}  {self.flow}/{self.name}  {self.state}  {self.started}"


def run_url(ui_url: str, flow_run_id: str) -> str:
    """The UI page of a flow run.

    >>> run_url("http://127.0.0.1:4200", "0a1b")
    'http://127.0.0.1:4200/runs/flow-run/0a1b'
    """
    return f"{ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}"


def writer_runs(folders: Iterable[Path]) -> list[str]:
    """The flow-run ids the ``done`` markers under ``folders`` (test-set output folders, or an
    inference_dir holding them) name, oldest first: the last one is the run that finished the stage."""
    found: dict[str, float] = {}
    for folder in folders:
        for done in Path(folder).rglob(DONE_NAME):
            record = read_marker(done.parent) if done.is_file() else None
            run_id = (record or {}).get("flow_run_id")
            if run_id:
                found[run_id] = max(found.get(run_id, 0.0), done.stat().st_mtime)
    return sorted(found, key=found.get)


def describe_runs(ids: Iterable[str] | None = None, limit: int = 10) -> list[RunLink]:
    """The flow runs ``ids`` (in that order), or the ``limit`` most recent ones, as the Prefect API in
    this process's settings has them; an id it does not know is listed as ``not in this server's database``."""
    from prefect import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    links, flows = [], {}
    with get_client(sync_client=True) as client:
        if ids is None:
            runs = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=limit)
        else:
            runs = []
            for run_id in ids:
                try:
                    runs.append(client.read_flow_run(run_id))
                except Exception:  # noqa: BLE001 - e.g. outputs copied from another project
                    links.append(RunLink(run_id, "?", "?", "not in this server's database", ""))
        for run in runs:
            if run.flow_id not in flows:
                flows[run.flow_id] = client.read_flow(run.flow_id).name
            started = run.start_time or run.expected_start_time
            links.append(
                RunLink(
                    str(run.id),
                    flows[run.flow_id],
                    run.name,
                    run.state.name if run.state else "?",
                    started.astimezone().strftime("%Y-%m-%d %H:%M:%S") if started else "",
                )
            )
    return links


__all__ = ["RunLink", "describe_runs", "run_url", "writer_runs"]
