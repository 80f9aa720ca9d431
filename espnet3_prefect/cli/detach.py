"""``infer --detach``: submit a run of a deployment and return at once (replaces ESPnet3's async_mode).

espnet3-prefect infer --detach --config conf/inference.yaml [--deployment infer/slurm]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from espnet3_prefect.cli.common import SwitchCommand
from espnet3_prefect.errors import Espnet3PrefectError


def register(infer: argparse.ArgumentParser) -> None:
    """Add ``--detach`` and ``--deployment`` to the ``infer`` parser."""
    infer.add_argument(
        "--detach",
        action=SwitchCommand,
        handler=run_detach,
        help="submit a run of a deployment (default infer/local) and return at once; "
        "the run survives this shell (replaces ESPnet3's async_mode)",
    )
    infer.add_argument(
        "--deployment",
        default="infer/local",
        help="with --detach: the deployment to run, e.g. infer/slurm (default %(default)s)",
    )


def _deployment_name(name: str) -> str:
    return name if "/" in name else f"infer/{name}"


def run_detach(args: argparse.Namespace) -> int:
    from espnet3_prefect.cli.stages import infer_input
    from espnet3_prefect.config.load import load_config_input
    from espnet3_prefect.pipeline.stage import build_stages

    config, overrides = infer_input(args)  # in an ESPnet3 recipe: the launcher's config, resolved
    build_stages(load_config_input(config, overrides))  # fail here, not in the worker
    from espnet3_prefect.server.registry import find_api

    creds = find_api(args.state_dir)
    api_url = creds.api_url
    name = _deployment_name(args.deployment)
    if isinstance(config, list):
        config = [str(Path(c).resolve()) for c in config]
    parameters = {"config": config, "overrides": overrides, "workdir": os.getcwd()}
    flow_run, online = submit(creds, name, parameters)
    ui = api_url[: -len("/api")] if api_url.endswith("/api") else api_url
    print(f"flow run id: {flow_run.id}")
    print(f"flow run:    {flow_run.name} of deployment {name}")
    print(f"UI:          {ui}/runs/flow-run/{flow_run.id}")
    cert = f"PREFECT_API_SSL_CERT_FILE={creds.ssl_cert_file} " if creds.ssl_cert_file else ""
    print(f"watch:       {cert}PREFECT_API_URL={api_url} prefect flow-run logs {flow_run.id}")
    if not online:
        print(
            "warning: no worker is online on the deployment's work pool; the run waits until one starts "
            "(espnet3-prefect deploy-local starts one)",
            file=sys.stderr,
        )
    return 0


def submit(creds, name: str, parameters: dict):
    """Create a flow run of deployment ``name`` on the API ``creds``
    (:class:`~espnet3_prefect.disk.client_file.ClientCredentials`) reach; return it and whether its pool has a
    worker online."""
    from prefect.exceptions import ObjectNotFound

    api_url = creds.api_url
    with creds.sync_client() as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise Espnet3PrefectError(
                f"deployment {name!r} not found on {api_url}: run `espnet3-prefect deploy-local` "
                f"or `prefect deploy --all` from the project folder"
            ) from None
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        online = False
        if deployment.work_pool_name:
            workers = client.read_workers_for_work_pool(deployment.work_pool_name)
            online = any(str(getattr(w, "status", "")).upper().endswith("ONLINE") for w in workers)
    return flow_run, online
