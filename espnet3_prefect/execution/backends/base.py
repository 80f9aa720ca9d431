"""What every backend provides, and the defaults they share.

A backend is the knowledge of one ``parallel.env`` value: which Dask cluster class it uses (and
the pip extra that installs it), which ``parallel.options`` it accepts, the keyword arguments
its cluster gets (our loopback-safe defaults under the user's options), whether its workers
retire before a walltime, what ``cluster-script`` shows, and, for batch schedulers, the queue
commands that list and cancel a run's jobs.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from espnet3_prefect._internal.util import CLIENT_FILE_VAR, import_keeping_ctrl_c
from espnet3_prefect.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    from espnet3_prefect.execution.backends.jobs import JobQueue
    from espnet3_prefect.execution.backends.tls import RunCertificates
    from espnet3_prefect.execution.backends.walltime import Lifetime
    from espnet3_prefect.execution.spec import ParallelSpec

# Variables every worker needs; batch jobs and SSH workers get them explicitly, since not every
# scheduler passes the submitter's environment on (SGE and PBS do not without -V). With a Prefect
# API that asks for auth, the path of the 0600 client file stands in for the URL (server/auth.py): the
# worker preload reads URL and credential from it, so no credential is ever in a job script. The
# certificate an https:// API is verified with is a path, like the client file's (which also names it).
EXPORTED_ENV = ("PREFECT_API_URL", "PREFECT_API_SSL_CERT_FILE", "PYTHONPATH", CLIENT_FILE_VAR)
LOOPBACK_DASHBOARD = "127.0.0.1:0"
RUNNER_MANAGED = ("asynchronous", "loop", "start")
PREVIEW_JOB_NAME = "e3p-preview"
# Options that only mean something to a batch scheduler; a classic copy-paste mistake under local.
SCHEDULER_ONLY = (
    "queue",
    "account",
    "project",
    "walltime",
    "job_extra",
    "job_extra_directives",
    "job_script_prologue",
    "env_extra",
    "job_directives_skip",
    "header_skip",
    "job_cpu",
    "job_mem",
    "resource_spec",
    "log_directory",
    "shebang",
    "job_name",
    "cores",
    "memory",
)


@dataclass(frozen=True)
class ClusterContext:
    """What the cluster arguments need besides the ``parallel`` block, per run.

    ``job_name`` names this run's batch jobs (``options.job_name`` is only its prefix);
    ``log_directory`` is the default folder for the scheduler's job logs; ``environ`` (default
    ``os.environ``) supplies the variables exported to batch jobs and SSH workers;
    ``submit_errors``, when given, collects the submissions a batch scheduler rejected;
    ``certificates``: this run's TLS files (:class:`~espnet3_prefect.execution.backends.tls.RunCertificates`,
    created by the caller) when ``parallel.tls`` is on; without them the arguments name the folder
    a run would use (``cluster-script``). ``worker_preload`` names modules every worker imports as
    a Dask preload while it starts (the flows' task modules; backends whose workers take
    ``preload`` use it, the others ignore it). ``forkserver_preload``: modules a fork server
    imports once for all of this machine's workers (``env: local``, :mod:`.forkserver`); empty:
    each worker starts as a fresh interpreter (Dask's ``spawn``). ``stage_modules``: the modules of
    the stage's own classes (its provider, runner, model, dataset) that the fork server imports
    too, each where it can (:data:`.forkserver.STAGE_MODULES_VAR`); ``forkserver_environ``: variables
    the fork server starts with beside this process's (e.g. the ``PREFECT_HOME`` the run will export).
    """

    job_name: str = PREVIEW_JOB_NAME
    log_directory: str | None = None
    environ: Mapping[str, str] | None = None
    submit_errors: list | None = None
    certificates: RunCertificates | None = None
    worker_preload: tuple[str, ...] = ()
    forkserver_preload: tuple[str, ...] = ()
    stage_modules: tuple[str, ...] = ()
    forkserver_environ: Mapping[str, str] | None = None


def exported_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of :data:`EXPORTED_ENV` that are set (in ``environ``, default os.environ); the
    client file's path replaces the URL and the certificate's when there is one (the file names both).

    >>> exported_environment({"PREFECT_API_URL": "http://h:1/api", "ESPNET3_PREFECT_CLIENT_FILE": "/p/c.json"})
    {'ESPNET3_PREFECT_CLIENT_FILE': '/p/c.json'}
    >>> exported_environment({"PREFECT_API_URL": "https://h:1/api", "PREFECT_API_SSL_CERT_FILE": "/p/ca.pem"})
    {'PREFECT_API_URL': 'https://h:1/api', 'PREFECT_API_SSL_CERT_FILE': '/p/ca.pem'}
    """
    environ = os.environ if environ is None else environ
    exported = {k: environ[k] for k in EXPORTED_ENV if environ.get(k)}
    if CLIENT_FILE_VAR in exported:
        exported.pop("PREFECT_API_URL", None)
        exported.pop("PREFECT_API_SSL_CERT_FILE", None)
    elif not exported.get("PREFECT_API_URL", "").startswith("https://"):
        exported.pop("PREFECT_API_SSL_CERT_FILE", None)
    return exported


def needs_preload(exported: Mapping[str, str]) -> bool:
    """Whether workers must run the client-file preload
    (:data:`~espnet3_prefect._internal.util.CLIENT_FILE_PRELOAD`)."""
    return CLIENT_FILE_VAR in exported


def option_error(key: str, message: str) -> ConfigError:
    return ConfigError(f"parallel.options.{key}: {message}")


def keyword_names(*classes: type) -> set[str]:
    """Keyword parameters of the classes' ``__init__`` (what a cluster accepts as options)."""
    names = set()
    for cls in classes:
        names |= {
            p.name
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
    return names - {"self", "scheduler", "n_workers", "job_cls", *RUNNER_MANAGED}


class Backend:
    """One ``parallel.env`` value. Subclasses set the class attributes and override the hooks."""

    name: str = ""
    cluster_class: str = ""  # dotted path of the Dask cluster class
    extra: str | None = None  # the pip extra that installs it
    also_needs: tuple[str, ...] = ()  # modules the cluster class imports only when it starts
    batch: bool = False  # workers are jobs in a scheduler's queue (named, watched, cancelled)
    # parallel.no_worker_timeout_s's default: a run whose workers are all gone waits this long for one
    # (a nanny that restarts one, a running scheduler's own), then stops with a one-line error
    no_worker_timeout_s: float = 300.0
    queue: JobQueue | None = None  # lists/cancels this user's jobs; None where we cannot ask
    job_id_variable: str | None = None  # set inside a batch job: its id
    refuses_scheduler_options = False  # batch-scheduler options are a mistake here (see SCHEDULER_ONLY)
    start_at_once = False  # create the cluster on entering the runner: a remote start fails early, on one line
    tls_default = False  # parallel.tls when unset: scheduler <-> workers over TLS (backends/tls.py)
    tls_supported = False  # whether parallel.tls: true is possible here
    tls_files = False  # TLS needs this run's certificate files (workers in other processes or hosts)

    # -- validation ---------------------------------------------------------------------------

    def validate(
        self,
        options: dict,
        lifetime_margin_s: float | None = None,
        *,
        batch_envs: tuple[str, ...] = (),
        tls: bool | None = None,
    ) -> None:
        """Every check of ``parallel.options`` for this env, each failing on one line naming the key
        (``batch_envs``: where a misplaced batch-scheduler option belongs, for the message; ``tls``:
        ``parallel.tls`` as given, None for unset)."""
        for key in RUNNER_MANAGED:
            if key in options:
                raise option_error(key, "managed by espnet3-prefect, remove it")
        if "n_workers" in options:
            raise option_error("n_workers", "set parallel.n_workers instead")
        if self.refuses_scheduler_options:
            for key in options:
                if key in SCHEDULER_ONLY:
                    raise option_error(
                        key,
                        f"a batch-scheduler option, not valid with env {self.name!r} "
                        f"(it belongs under env: {'/'.join(batch_envs)})",
                    )
        self.check_options(options, lifetime_margin_s)
        if self.tls_supported:
            from espnet3_prefect.execution.backends.tls import check_tls_options, tls_enabled

            check_tls_options(options, tls_enabled(self, tls))

    def uses_tls(self, spec: ParallelSpec) -> bool:
        """Whether this run's scheduler and workers talk TLS (``spec.tls``, else this env's default)."""
        return self.tls_default if spec.tls is None else bool(spec.tls)

    def dask_settings(self, spec: ParallelSpec, context: ClusterContext | None = None) -> dict:
        """Dask configuration held in this process while the run's cluster lives (workers started
        later by adaptive scaling get it too); none by default."""
        return {}

    def certificate_folder(self, spec: ParallelSpec, context: ClusterContext) -> str | None:
        """Where this run's certificate folder goes when ``parallel.tls`` is on; None: a fresh
        private temporary folder on this machine (see :meth:`RunCertificates.temporary`)."""
        return None

    def check_options(self, options: dict, lifetime_margin_s: float | None) -> None:
        """Backend-specific checks; this default refuses names the cluster class does not take."""
        valid = self.valid_options()
        if valid is None:
            return
        unknown = sorted(set(options) - valid)
        if unknown:
            raise option_error(
                unknown[0], f"not an option of env {self.name!r}; valid options: {', '.join(sorted(valid))}"
            )

    def valid_options(self) -> set[str] | None:
        """Option names this env accepts; None where we cannot tell before it starts."""
        return None

    @property
    def has_walltime(self) -> bool:
        """Whether workers run under a walltime (then ``parallel.lifetime_margin_s`` applies)."""
        return False

    # -- the cluster ----------------------------------------------------------------------------

    def load_cluster_class(self) -> type:
        """Import the cluster class; a missing package names the pip extra to install."""
        module_name, _, attr = self.cluster_class.rpartition(".")
        try:
            module = import_keeping_ctrl_c(module_name)
            for extra_module in self.also_needs:
                import_keeping_ctrl_c(extra_module)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or module_name
            raise MissingExtraError(
                f'parallel.env {self.name!r} needs the package {missing!r}: pip install "espnet3-prefect[{self.extra}]"'
            ) from None
        return getattr(module, attr)

    def cluster_kwargs(self, spec: ParallelSpec, context: ClusterContext) -> dict[str, Any]:
        """Keyword arguments for the cluster class: our defaults, then the user's options."""
        return {**spec.options, "n_workers": spec.n_workers}

    def lifetime(self, spec: ParallelSpec) -> Lifetime | None:
        """When workers retire before their walltime; None where they have none."""
        return None

    def adapt_kwargs(self, spec: ParallelSpec) -> dict[str, Any] | None:
        """Workers that retire before their walltime are replaced: adapt between n_workers and n_workers."""
        if self.lifetime(spec) is None:
            return None
        return {"minimum": spec.n_workers, "maximum": spec.n_workers}

    def before_start(self, spec: ParallelSpec) -> None:
        """Checks that need this machine (e.g. visible GPUs); run when the runner is built."""

    def start_error_hint(self, exc: BaseException) -> str:
        """A hint appended to a cluster start error; non-empty makes it a config error."""
        return ""

    # -- cluster-script -------------------------------------------------------------------------

    def submitted_text(self, job_script: str) -> str:
        """What submitting ``job_script`` hands the scheduler, for people: the script itself, except
        where the scheduler takes it otherwise (OAR: the ``oarsub`` command line)."""
        return job_script

    def preview(self, spec: ParallelSpec, kwargs: Mapping[str, Any]) -> tuple[str, str]:
        """``(kind, text)`` shown by ``cluster-script``: ``"job script"`` or ``"yaml"``."""
        from espnet3_prefect.execution.backends.preview import dump_yaml

        return "yaml", f"# env {self.name}: no job script; the cluster arguments\n" + dump_yaml(dict(kwargs))
