from __future__ import annotations

import importlib.util

import pytest

from espnet3_prefect.errors import ConfigError, MissingExtraError
from espnet3_prefect.execution.backends import cluster_kwargs
from espnet3_prefect.execution.backends.local import check_gpu_count, visible_gpu_count
from espnet3_prefect.execution.spec import ParallelSpec, build_task_runner


def test_local_defaults_bind_loopback_and_user_options_win():
    spec = ParallelSpec.from_config({"env": "local", "n_workers": 3, "options": {"threads_per_worker": 2}})
    kwargs = cluster_kwargs(spec)
    assert kwargs["n_workers"] == 3 and kwargs["threads_per_worker"] == 2
    assert kwargs["host"] == "127.0.0.1" and kwargs["dashboard_address"] == "127.0.0.1:0"


def test_slurm_options_are_forwarded_and_checked_against_dask_jobqueue():
    spec = ParallelSpec.from_config(
        {
            "env": "slurm",
            "n_workers": 8,
            "options": {
                "queue": "gpu",
                "account": "lab",
                "cores": 4,
                "memory": "32GB",
                "walltime": "04:00:00",
                "job_extra_directives": ["--gres=gpu:1"],
                "job_script_prologue": ["module load cuda"],
            },
        }
    )
    runner = build_task_runner(spec)
    assert runner.cluster_kwargs["n_workers"] == 8 and runner.cluster_kwargs["queue"] == "gpu"
    assert runner.resolved_cluster_class.__name__ == "SLURMCluster"
    with pytest.raises(
        ConfigError, match="parallel.options.gres: not an option of env 'slurm'; valid options: .*walltime"
    ):
        ParallelSpec.from_config({"env": "slurm", "options": {"gres": "gpu:1"}})


@pytest.mark.parametrize(
    "env, extra, module, options",
    [("kube", "kube", "dask_kubernetes", {"image": "registry/e3p:1"}), ("local_gpu", "gpu", "dask_cuda", {})],
)
def test_missing_optional_backend_names_the_pip_extra(env, extra, module, options, monkeypatch):
    if importlib.util.find_spec(module) is not None:  # .venv-espnet has [kube]; .venv has neither
        pytest.skip(f"{module} is installed here: the error for its absence is checked in .venv")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # local_gpu: a GPU is there, only dask-cuda is missing
    spec = ParallelSpec.from_config({"env": env, "options": options})
    with pytest.raises(MissingExtraError, match=f'pip install "espnet3-prefect\\[{extra}\\]"'):
        build_task_runner(spec)


def test_local_gpu_refuses_more_workers_than_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert visible_gpu_count() == 2
    check_gpu_count(2, 2)
    with pytest.raises(
        ConfigError, match="parallel.n_workers: 4 exceeds the 2 visible GPU\\(s\\) .*CUDA_VISIBLE_DEVICES=0,1"
    ):
        check_gpu_count(4, visible_gpu_count())


def test_preflight_checks_the_gpus_before_anything_starts(monkeypatch):
    from espnet3_prefect.execution import backends
    from espnet3_prefect.execution.spec import preflight

    gpu = backends.get("local_gpu")
    monkeypatch.setattr(type(gpu), "load_cluster_class", lambda self: object)  # dask-cuda cannot run here
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match="parallel.env: 'local_gpu' needs a GPU and none is visible here"):
        preflight(ParallelSpec.from_config({"env": "local_gpu"}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    preflight(ParallelSpec.from_config({"env": "local_gpu"}))
    preflight(ParallelSpec.from_config({"env": "local"}))


def test_ssh_hosts_expand_to_n_workers():
    spec = ParallelSpec.from_config({"env": "ssh", "n_workers": 3, "options": {"hosts": ["s", "w1", "w2"]}})
    assert cluster_kwargs(spec)["hosts"] == ["s", "w1", "w2", "w1"]
    with pytest.raises(ConfigError, match="parallel.options.hosts"):
        cluster_kwargs(ParallelSpec.from_config({"env": "ssh", "options": {"hosts": ["only"]}}))


def test_address_connects_to_a_running_scheduler():
    spec = ParallelSpec.from_config({"address": "tcp://127.0.0.1:8786"})
    assert build_task_runner(spec).address == "tcp://127.0.0.1:8786"
    with pytest.raises(ConfigError, match="parallel.address: 'nope' is not a scheduler address"):
        ParallelSpec.from_config({"address": "nope"})


def test_no_worker_timeout_defaults_by_backend_null_waits_forever_and_bad_values_name_the_key():
    slurm = {"env": "slurm", "options": {"cores": 1, "memory": "1GB", "walltime": "00:10:00"}}
    assert ParallelSpec.from_config({"env": "local"}).no_worker_timeout_s == 300.0
    assert ParallelSpec.from_config({"address": "tcp://127.0.0.1:8786"}).no_worker_timeout_s == 300.0
    assert ParallelSpec.from_config(slurm).no_worker_timeout_s == 3600.0  # replacement jobs may queue
    assert ParallelSpec.from_config({**slurm, "no_worker_timeout_s": 60}).no_worker_timeout_s == 60.0
    assert ParallelSpec.from_config({"no_worker_timeout_s": None}).no_worker_timeout_s is None
    for bad in (0, -1, "5", True, float("inf")):
        with pytest.raises(ConfigError, match=r"^parallel.no_worker_timeout_s: must be a number of seconds > 0"):
            ParallelSpec.from_config({"no_worker_timeout_s": bad})


def test_managed_and_misplaced_options_are_rejected():
    with pytest.raises(ConfigError, match="parallel.options.asynchronous: managed by espnet3-prefect"):
        ParallelSpec.from_config({"options": {"asynchronous": True}})
    with pytest.raises(ConfigError, match="parallel.options.n_workers: set parallel.n_workers instead"):
        ParallelSpec.from_config({"options": {"n_workers": 2}})


def test_allow_overwrite_lock_is_espnet3s_boolean():
    assert ParallelSpec.from_config({"env": "local", "allow_overwrite_lock": True}).allow_overwrite_lock is True
    assert ParallelSpec.from_config({"env": "local"}).allow_overwrite_lock is False
    assert ParallelSpec.from_config({"address": "tcp://127.0.0.1:8786", "allow_overwrite_lock": False}).address
    with pytest.raises(ConfigError, match="^parallel.allow_overwrite_lock: must be true or false, got 'yes'$"):
        ParallelSpec.from_config({"allow_overwrite_lock": "yes"})


def test_local_workers_preload_ours_then_the_users_modules():
    from espnet3_prefect.execution.backends.base import ClusterContext
    from espnet3_prefect.execution.backends.local import LocalBackend

    ours = ("espnet3_prefect.tasks.preload",)
    plain = ParallelSpec.from_config({"env": "local"})
    assert "preload" not in cluster_kwargs(plain)  # cluster-script previews: nothing added
    assert LocalBackend().cluster_kwargs(plain, ClusterContext(worker_preload=ours))["preload"] == list(ours)
    theirs = ParallelSpec.from_config({"env": "local", "options": {"preload": "my_site.setup"}})
    assert LocalBackend().cluster_kwargs(theirs, ClusterContext(worker_preload=ours))["preload"] == [
        *ours,
        "my_site.setup",
    ]


def test_local_gpu_without_a_gpu_says_so_before_the_missing_extra(monkeypatch):
    """No GPU: the [gpu] extra would not help, so it is not mentioned (a config error: exit 2); GPUs
    but no dask-cuda: then the extra is what is missing."""
    from espnet3_prefect.errors import MissingExtraError
    from espnet3_prefect.execution import backends
    from espnet3_prefect.execution.spec import preflight

    gpu = backends.get("local_gpu")

    def no_dask_cuda(self):
        raise MissingExtraError(
            "parallel.env 'local_gpu' needs the package 'dask_cuda': pip install \"espnet3-prefect[gpu]\""
        )

    monkeypatch.setattr(type(gpu), "load_cluster_class", no_dask_cuda)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError) as err:
        preflight(ParallelSpec.from_config({"env": "local_gpu"}))
    assert "[gpu]" not in str(err.value) and "none is visible" in str(err.value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(MissingExtraError, match=r"espnet3-prefect\[gpu\]"):
        preflight(ParallelSpec.from_config({"env": "local_gpu"}))


def test_local_gpu_workers_get_our_preload_and_env_under_their_own_gpu(monkeypatch):
    """local_gpu forks its workers like local: our preload, then the user's; the nanny ``env`` is the
    driver's environment with the user's ``options.env``, and dask-cuda's per-worker
    ``CUDA_VISIBLE_DEVICES`` goes on top of it and onto the list a forked worker keeps."""
    from espnet3_prefect.execution.backends.base import ClusterContext
    from espnet3_prefect.execution.backends.forkserver import KEYS_VAR
    from espnet3_prefect.execution.backends.local import LocalGpuBackend, with_worker_env

    monkeypatch.setenv("E3P_T_DRIVER", "d")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = ParallelSpec.from_config(
        {"env": "local_gpu", "options": {"preload": "my_site.setup", "env": {"E3P_T_USER": 1}}}
    )
    context = ClusterContext(worker_preload=("ours",), forkserver_preload=("torch",))
    kwargs = LocalGpuBackend().cluster_kwargs(spec, context)
    assert kwargs["preload"] == ["ours", "my_site.setup"]
    assert kwargs["env"]["E3P_T_DRIVER"] == "d" and kwargs["env"]["E3P_T_USER"] == "1"
    assert LocalGpuBackend.cluster_class.endswith("backends.cuda_cluster.LocalCUDACluster")
    dask_cuda_specs = {0: {"options": {"env": {"CUDA_VISIBLE_DEVICES": "1,0"}}}, 1: {"options": {"env": {}}}}
    specs = with_worker_env(dask_cuda_specs, kwargs["env"])
    first, second = specs[0]["options"]["env"], specs[1]["options"]["env"]
    assert first["CUDA_VISIBLE_DEVICES"] == "1,0" and first["E3P_T_USER"] == "1" and first["E3P_T_DRIVER"] == "d"
    assert {"CUDA_VISIBLE_DEVICES", "E3P_T_DRIVER", "E3P_T_USER"} <= set(first[KEYS_VAR].split(","))
    assert "CUDA_VISIBLE_DEVICES" not in second and "CUDA_VISIBLE_DEVICES" not in second[KEYS_VAR].split(",")


def test_the_task_runners_fast_path_is_on_for_the_installed_prefect_and_gated_outside_the_tested_range():
    from espnet3_prefect.execution.task_runner import TESTED, fast_path_problem, untested_versions

    assert fast_path_problem() is None  # pyproject.toml's pins are the tested range
    assert untested_versions({"prefect": "3.8.8", "prefect-dask": "0.3.7"}) == []
    assert untested_versions({"prefect": "3.8.7", "prefect-dask": "0.4.0"}) == ["prefect 3.8.7", "prefect-dask 0.4.0"]
    assert set(TESTED) == {"prefect", "prefect-dask"}


@pytest.mark.skipif(importlib.util.find_spec("dask_jobqueue") is None, reason="dask-jobqueue not installed")
def test_a_batch_backend_keeps_ctrl_c_handled_after_it_imports_dask_jobqueue():
    """dask_jobqueue's import installs a SIGINT handler that exits with status 0 (a Ctrl-C would end
    a run as if it had succeeded). Loading a backend's cluster class, or checking its options, puts
    the handler back. In a fresh interpreter: the test process may have imported it already."""
    import subprocess
    import sys

    probe = (
        "import signal, sys\n"
        # a suite started in the background inherits SIGINT ignored: Python's own handler first
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from espnet3_prefect.execution import backends\n"
        "backends.get('slurm').valid_options()\n"
        "backends.get('sge').load_cluster_class()\n"
        "assert 'dask_jobqueue.runner' in sys.modules\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
