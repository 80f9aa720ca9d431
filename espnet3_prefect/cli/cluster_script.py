"""``espnet3-prefect cluster-script``: show what the ``parallel`` block would start, start nothing.

    espnet3-prefect cluster-script --config conf/inference.yaml deployments/parallel_slurm.yaml [key=value ...]

For a batch scheduler (slurm, pbs, sge, lsf, htcondor, moab, oar) it prints the job script one
worker job would get, with every default of ours filled in (job logs folder, loopback
dashboards, exported PREFECT_API_URL/PYTHONPATH, worker lifetime, the paths of the run's TLS
certificate files, never their contents); for OAR, whose script is
submitted inline, the ``oarsub`` command line itself. Only the job name
(``e3p-<flow run>`` at run time) and the scheduler address are placeholders. Nothing is
submitted and no scheduler starts. For kube it prints the DaskCluster resource (with
dask-kubernetes installed) or the KubeCluster arguments; for ssh and local the cluster
arguments, as YAML.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from espnet3_prefect.cli.common import add_config, configs_of


def register(sub) -> None:
    parser = sub.add_parser(
        "cluster-script",
        help="print the job script the parallel block would submit (submits nothing)",
        description=__doc__.split("\n\n")[0],
    )
    add_config(parser)
    parser.add_argument(
        "--stage",
        default=None,
        help="print the job one stage runs as where the config's placement.<STAGE> block places it (e.g. train)",
    )
    parser.set_defaults(handler=run_cluster_script)


def cluster_preview(cfg) -> tuple[str, str]:
    """``(kind, text)`` for a loaded config: ``("job script", ...)`` or ``("yaml", ...)``."""
    from omegaconf import OmegaConf

    from espnet3_prefect.execution import backends
    from espnet3_prefect.execution.backends.base import ClusterContext
    from espnet3_prefect.execution.backends.jobs import JOB_PREFIX, default_log_directory
    from espnet3_prefect.execution.backends.preview import dump_yaml
    from espnet3_prefect.execution.spec import ParallelSpec

    block = cfg.get("parallel")
    spec = ParallelSpec.from_config(OmegaConf.to_container(block, resolve=True) if block else None)
    if spec.address:
        return "yaml", dump_yaml({"address": spec.address, "n_workers": spec.n_workers})
    inference_dir = Path(str(cfg.get("inference_dir") or ".")).expanduser().resolve()
    job_name = f"{spec.options.get('job_name') or JOB_PREFIX}-preview"
    context = ClusterContext(job_name=job_name, log_directory=str(default_log_directory(inference_dir, job_name)))
    backend = backends.get(spec.env)
    return backend.preview(spec, backend.cluster_kwargs(spec, context))


def stage_preview(cfg, stage: str) -> tuple[str, str]:
    """``(kind, text)`` for the job ``stage`` runs as where ``placement.<stage>`` of ``cfg`` places it: the
    batch job's script (its folder under ``exp_dir``, its name ``e3p-<stage>-preview``), or for ``env:
    local`` the command its child process runs."""
    from omegaconf import OmegaConf

    from espnet3_prefect.errors import ConfigError
    from espnet3_prefect.execution import backends
    from espnet3_prefect.execution.backends.preview import dump_yaml, no_new_folders
    from espnet3_prefect.execution.stage_job import JOBS_DIRNAME, BatchJob, JobPaths, job_command
    from espnet3_prefect.recipe.placement import KEY, placement_spec

    key = f"{KEY}.{stage}"
    block = OmegaConf.select(cfg, key)
    if block is None:
        raise ConfigError(f"{key}: not in the given config (the config {stage} reads places it)")
    spec = placement_spec(block, key)
    paths = JobPaths(Path(str(cfg.get("exp_dir") or ".")).expanduser().resolve() / JOBS_DIRNAME / stage)
    if spec.env == "local":
        return "yaml", dump_yaml({"env": "local", "command": job_command(paths, Path.cwd())})
    with no_new_folders(paths.folder):
        job = BatchJob(backends.get(spec.env), spec, paths, f"e3p-{stage}-preview", cwd=Path.cwd())
        return "job script", job.script()


def run_cluster_script(args: argparse.Namespace) -> int:
    from espnet3_prefect.config.load import load_config

    configs, overrides = configs_of(args)
    cfg = load_config(configs, overrides)
    kind, text = stage_preview(cfg, args.stage) if args.stage else cluster_preview(cfg)
    if kind == "job script":
        print("# job name and scheduler address are set per flow run; nothing was submitted", file=sys.stderr)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
