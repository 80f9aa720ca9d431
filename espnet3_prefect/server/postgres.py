"""PostgreSQL for a lab's Prefect server: a private cluster started from the machine's own binaries, or
a database the lab already runs.

A private cluster lives in one folder (:func:`start_postgres`)::

    FOLDER/data      the cluster (initdb), owned by the user PostgreSQL runs as
    FOLDER/pgpass    the generated password of the role ``prefect``, mode 0600, in libpq's
                     password-file format: Prefect's driver (asyncpg) reads it through PGPASSFILE
    FOLDER/port      the port it listened on last (used again while free)
    FOLDER/postgres.log, FOLDER/initdb.log

It listens on 127.0.0.1 only (no Unix socket), on the port of last time when free, else a free one.
The only role that may log in is ``prefect``, over TCP with SCRAM-SHA-256; it owns the database
``prefect`` (and may create more of its own: :func:`create_database`); the superuser has no password
and so cannot log in at all. The password is never on a
command line, in the environment or in a log: the role is created in PostgreSQL's single-user mode
from standard input, with the SCRAM verifier (not the password) as its ``PASSWORD``, and the server
gets only the path of ``pgpass`` (:meth:`Database.server_environ`). PostgreSQL refuses to run as
root: as root it runs as the ``postgres`` user of Debian's ``postgresql`` package (who must be able
to enter FOLDER), as anyone else as that user.

A lab's own database is given as a URL without a password (:func:`user_database`): the password
goes in ``~/.pgpass`` or the file ``PGPASSFILE`` names, which the driver reads.

Prefect creates its tables in the database on the server's first start (its migrate-on-start, or
:func:`migrate` for a server whose API processes start apart). Stop a private cluster with
:func:`stop_postgres` (by pid: a fast shutdown, every connection closed, then its process group
killed if it is still there after ``timeout_s``); its data stays for the next start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import os
import pwd
import secrets
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import psutil

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect._internal.proc import running, started_by, stop_process
from espnet3_prefect.errors import ConfigError, Espnet3PrefectError

#: the Debian package holding the server binaries (initdb, postgres)
PACKAGE = "postgresql"
#: where Debian installs each major version's binaries
BIN_ROOT = Path("/usr/lib/postgresql")
#: the role and the database Prefect uses in a private cluster
ROLE = DATABASE = "prefect"
#: the private cluster's folder in a state dir (``deploy-local --postgres``)
STATE_SUBDIR = "postgres"
#: the user PostgreSQL runs as when we are root (it refuses root)
SYSTEM_USER = "postgres"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
#: how long a postmaster that pg_ctl stopped may take to go, and again once SIGKILLed
GONE_WAIT_S = 10.0
SCRAM_ITERATIONS = 4096


class PostgresError(Espnet3PrefectError, RuntimeError):
    """PostgreSQL is missing, or a private cluster could not be made, started or stopped."""


@dataclass(frozen=True)
class Database:
    """Where a Prefect server keeps its data. ``url``: a ``postgresql+asyncpg://`` URL without a
    password; ``passfile``: the password file for it (None: the driver's own lookup, PGPASSFILE else
    ``~/.pgpass``); ``pid``: the private cluster's postmaster (None: a lab's own database)."""

    url: str
    passfile: Path | None = None
    pid: int | None = None

    def server_environ(self) -> dict[str, str]:
        """The variables that point a Prefect server (``prefect server start``, its API and services)
        at this database; the password stays in the file.

        >>> env = Database("postgresql+asyncpg://prefect@127.0.0.1:5999/prefect", Path("/s/pgpass")).server_environ()
        >>> env["PREFECT_API_DATABASE_CONNECTION_URL"], env["PGPASSFILE"]
        ('postgresql+asyncpg://prefect@127.0.0.1:5999/prefect', '/s/pgpass')
        """
        env = {"PREFECT_API_DATABASE_CONNECTION_URL": self.url}
        if self.passfile is not None:
            env["PGPASSFILE"] = str(self.passfile)
        return env

    def describe(self) -> str:
        """The URL as shown to users (it never holds a password).

        >>> Database("postgresql+asyncpg://prefect@127.0.0.1:5999/prefect", pid=12).describe()
        'PostgreSQL postgresql+asyncpg://prefect@127.0.0.1:5999/prefect (private cluster, pid 12)'
        """
        return f"PostgreSQL {self.url}" + (f" (private cluster, pid {self.pid})" if self.pid else "")


def user_database(url: str, option: str = "--database") -> Database:
    """A lab's own PostgreSQL, from ``url`` (``postgresql://`` or ``postgresql+asyncpg://``, user,
    host and database named; ``option`` names it in errors). A URL holding a password is refused:
    a command line is visible to every user of the machine.

    >>> user_database("postgresql://lab@db.example.org:5432/prefect").url
    'postgresql+asyncpg://lab@db.example.org:5432/prefect'
    >>> try:
    ...     user_database("postgresql://lab:secret@db/prefect")
    ... except ConfigError as exc:
    ...     print(str(exc)[:50])
    --database: the URL holds a password, which any us
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise ConfigError(f"{option}: {url!r} is not a postgresql:// URL (SQLite is the default without {option})")
    if parts.password is not None:
        raise ConfigError(
            f"{option}: the URL holds a password, which any user of this machine can read on a command line; "
            "put it in ~/.pgpass or the file PGPASSFILE names (mode 0600) and give the URL without it"
        )
    if not parts.hostname or not parts.username or not parts.path.strip("/"):
        raise ConfigError(
            f"{option}: {url!r} must name a user, a host and a database (postgresql://USER@HOST[:PORT]/DB)"
        )
    return Database(urllib.parse.urlunsplit(("postgresql+asyncpg", *parts[1:])))


def bin_dir() -> Path:
    """The newest PostgreSQL server binaries under /usr/lib/postgresql (Debian's layout)."""
    found = sorted(
        (p.parent for p in BIN_ROOT.glob("*/bin/initdb") if (p.parent / "postgres").is_file()),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")],
    )
    if not found:
        raise PostgresError(
            f"no PostgreSQL server binaries (initdb, postgres) under {BIN_ROOT}: install the Debian package {PACKAGE!r}"
        )
    return found[-1]


def missing() -> str | None:
    """Why a private cluster cannot start here (no binaries; root without a ``postgres`` user), one
    line; None when it can."""
    try:
        bin_dir()
        _run_as()
    except PostgresError as exc:
        return str(exc)
    return None


def _run_as() -> pwd.struct_passwd | None:
    """Whom PostgreSQL runs as: None (ourselves), or the ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise PostgresError(
            f"PostgreSQL refuses to run as root and there is no {SYSTEM_USER!r} user: "
            f"install the Debian package {PACKAGE!r}, or run as an ordinary user"
        ) from None


def _as_user(user: pwd.struct_passwd | None) -> dict:
    return {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677): given as a
    role's ``PASSWORD``, the password itself never reaches the server.

    >>> scram_verifier("pw", salt=bytes(16), iterations=2)[:41]
    'SCRAM-SHA-256$2:AAAAAAAAAAAAAAAAAAAAAA==$'
    """
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(hashlib.sha256(client_key).digest())}:{b64(server_key)}"


def _reachable(folder: Path, user: pwd.struct_passwd | None) -> None:
    """As root: the postgres user must be able to enter ``folder``; the error names the first folder
    on the way that stops it."""
    if user is None:
        return

    def enters(path: Path) -> bool:
        return subprocess.run(["test", "-x", str(path)], **_as_user(user), capture_output=True).returncode == 0

    if enters(folder):
        return
    blocking = next((p for p in [*reversed(folder.parents), folder] if not enters(p)), folder)
    raise PostgresError(
        f"PostgreSQL runs as user {user.pw_name!r} (it refuses root), who cannot enter {blocking} "
        f"(on the way to {folder}): choose a state dir it can reach, or let it pass "
        f"(setfacl -m u:{user.pw_name}:x {blocking})"
    )


def _initialise(folder: Path, user: pwd.struct_passwd | None, durable: bool) -> None:
    """initdb, our settings, the role and database (single-user mode, from standard input)."""
    bins, data = bin_dir(), folder / "data"
    data.mkdir(mode=0o700)
    if user is not None:
        os.chown(data, user.pw_uid, user.pw_gid)
    superuser = user.pw_name if user is not None else pwd.getpwuid(os.geteuid()).pw_name
    with open(folder / "initdb.log", "wb") as log:
        done = subprocess.run(
            [str(bins / "initdb"), "-D", str(data), "-U", superuser, "-A", "reject", "-E", "UTF8", "--locale=C.UTF-8"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **_as_user(user),
        )
    if done.returncode != 0:
        tail = " ".join((folder / "initdb.log").read_text(errors="replace").split()[-30:])
        raise PostgresError(f"initdb failed for {data} (exit {done.returncode}); {folder / 'initdb.log'}: {tail}")
    settings = [
        "# espnet3-prefect (server/postgres.py): loopback only, no Unix socket, SCRAM passwords",
        "listen_addresses = '127.0.0.1'",
        "unix_socket_directories = ''",
        "password_encryption = 'scram-sha-256'",
        "log_destination = 'stderr'",
        "logging_collector = off",
        # a commit returns before its WAL is on disk (written within 3 x wal_writer_delay, 0.6 s):
        # a machine that loses power loses at most that much of the runs' states, never the
        # database's consistency; the recorder's many small commits no longer wait for the disk
        "synchronous_commit = off",
    ]
    if not durable:  # a test's throw-away cluster
        settings += ["fsync = off", "full_page_writes = off"]
    with open(data / "postgresql.conf", "a") as conf:
        conf.write("\n" + "\n".join(settings) + "\n")
    (data / "pg_hba.conf").write_text(
        f"# espnet3-prefect: only {ROLE}, over loopback TCP, with its password\n"
        f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n"
    )
    password = secrets.token_hex(24)  # [0-9a-f]: nothing to escape in SQL or in a pgpass line
    sql = (
        f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{scram_verifier(password)}';\n"
        f"CREATE DATABASE {DATABASE} OWNER {ROLE} ENCODING 'UTF8';\n"
    )
    single = subprocess.run(
        [str(bins / "postgres"), "--single", "-D", str(data), "postgres"],
        input=sql,
        capture_output=True,
        text=True,
        **_as_user(user),
    )
    if single.returncode != 0 or "ERROR:" in single.stderr:
        raise PostgresError(
            f"creating role and database {DATABASE!r} in {data} failed: {' '.join(single.stderr.split())[-400:]}"
        )
    _write_passfile(folder, password)
    (folder / "initialised").touch()  # last: a folder without it is a half-made cluster, made again


def _write_passfile(folder: Path, password: str, port: int | None = None) -> None:
    line = f"127.0.0.1:{port or '*'}:*:{ROLE}:{password}\n"
    tmp = folder / ".pgpass.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, folder / "pgpass")


def _postmaster(data: Path) -> tuple[int, int, str] | None:
    """(pid, port, status) from ``postmaster.pid`` while that postmaster runs; else None."""
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        pid, started, port = int(lines[0]), int(lines[2]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    if not (running(pid) and started_by(pid, started)):  # not a stale pid file whose pid another process took
        return None
    return pid, port, lines[7].strip() if len(lines) > 7 else ""


def _database(folder: Path, pid: int, port: int) -> Database:
    return Database(f"postgresql+asyncpg://{ROLE}@127.0.0.1:{port}/{DATABASE}", folder / "pgpass", pid)


def running_postgres(folder: Path) -> Database | None:
    """The private cluster of ``folder`` while it runs and accepts connections, else None."""
    folder = Path(folder).resolve()
    found = _postmaster(folder / "data")
    return _database(folder, found[0], found[1]) if found and found[2] == "ready" else None


def _pick_port(folder: Path) -> int:
    from espnet3_prefect.server.port import project_port
    from espnet3_prefect.server.process import free_port

    return project_port(folder) or free_port()


def start_postgres(
    folder: Path, *, port: int | None = None, durable: bool = True, timeout_s: float = START_TIMEOUT_S
) -> Database:
    """The private cluster of ``folder`` (created on first use), started unless it runs already.

    ``port``: where to listen (default: last time's when free, else a free one). ``durable=False``:
    fsync off, for a test's throw-away cluster. The postmaster runs in a session of its own, not
    bound to the caller; stop it with :func:`stop_postgres`.
    """
    from espnet3_prefect.server.port import PORT_FILE

    folder = Path(folder).resolve()
    user = _run_as()
    bins = bin_dir()
    folder.mkdir(parents=True, exist_ok=True)
    if user is not None:
        folder.chmod(folder.stat().st_mode | 0o011)  # the postgres user passes through to data/ (and reads nothing)
    _reachable(folder, user)
    if not (folder / "initialised").is_file():
        if (folder / "data").exists():  # a cluster half made by an interrupted start
            subprocess.run(["rm", "-rf", "--", str(folder / "data")], check=True)
        _initialise(folder, user, durable)
    already = running_postgres(folder)
    if already is not None:
        return already
    port, logfile = port or _pick_port(folder), folder / "postgres.log"
    with open(logfile, "ab") as log:  # the server's output too: pg_ctl hands it its own
        started = subprocess.run(
            [str(bins / "pg_ctl"), "start", "-w", "-s", "-t", _seconds(timeout_s), "-D", str(folder / "data")]
            + ["-o", f"-p {port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **_as_user(user),
        )
    found = _postmaster(folder / "data")
    if started.returncode == 0 and found and found[2] == "ready":
        atomic_write_text(folder / PORT_FILE, str(port))
        return _database(folder, found[0], port)
    if found:  # still starting up
        stop_postgres(found[0])
        raise PostgresError(f"PostgreSQL did not accept connections in {timeout_s:g} s; see {logfile}")
    tail = " ".join(logfile.read_text(errors="replace").split()[-40:])
    raise PostgresError(f"PostgreSQL did not start (pg_ctl exit {started.returncode}); {logfile}: {tail}")


def stop_postgres(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the postmaster ``pid`` (started by :func:`start_postgres`): ``pg_ctl stop -m fast``,
    PostgreSQL's fast shutdown (open transactions rolled back, a checkpoint, every backend gone), then
    SIGKILL to its process group after ``timeout_s`` (and :data:`GONE_WAIT_S`). True once it is gone;
    False when it was not running (or is no cluster's postmaster: its working directory, the data dir,
    names another pid). Raises :class:`PostgresError` when it still runs after SIGKILL."""
    if not (pid > 0 and running(pid)):
        return False
    try:
        proc = psutil.Process(pid)
        data = Path(proc.cwd())  # a postmaster works in its data dir
    except psutil.Error:
        return False
    if (_postmaster(data) or (None,))[0] != pid:
        return False
    stop = [str(bin_dir() / "pg_ctl"), "stop", "-w", "-s", "-m", "fast", "-t", _seconds(timeout_s), "-D", str(data)]
    stopped = subprocess.run(stop, capture_output=True, stdin=subprocess.DEVNULL, **_as_user(_run_as()))
    # pg_ctl told it (SIGINT); SIGKILL to its group is the last resort, at once when pg_ctl failed
    if not stop_process(
        proc, GONE_WAIT_S if stopped.returncode == 0 else 0, first=None, group=True, kill_wait_s=GONE_WAIT_S
    ):
        raise PostgresError(f"PostgreSQL (pid {pid}, {data}) still runs after SIGKILL")
    return True


def _seconds(timeout_s: float) -> str:
    """A timeout as pg_ctl's ``-t`` takes it: whole seconds, at least one."""
    return str(max(1, math.ceil(timeout_s)))


def create_database(database: Database, name: str, template: str | None = None) -> Database:
    """A new database ``name`` (letters, digits, ``_``) in the private cluster of ``database``, owned
    by its role, a copy of ``template`` when given (which nobody may be connected to): a fresh,
    already migrated database per server in tests. Returns it as a :class:`Database` (``pid`` None:
    stopping the cluster is its owner's business)."""
    import asyncio

    for given in (name, template or "x"):
        if not given.replace("_", "").isalnum() or not given[0].isalpha():
            raise ValueError(f"database name {given!r}: letters, digits and _ only, a letter first")
    url = urllib.parse.urlsplit(database.url)

    async def create() -> None:
        import asyncpg

        conn = await asyncpg.connect(
            host=url.hostname,
            port=url.port,
            user=url.username,
            database=url.path.strip("/"),
            passfile=database.passfile,
        )
        try:
            await conn.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        finally:
            await conn.close()

    asyncio.run(create())
    return Database(urllib.parse.urlunsplit(url._replace(path=f"/{name}")), database.passfile)


def migrate(database: Database, env: dict[str, str] | None = None, timeout_s: float = 600) -> None:
    """Create or upgrade Prefect's tables in ``database`` (``prefect server database upgrade``), for
    servers started with migrate-on-start off (several API processes on one database). ``env``: the
    base environment (default this process's)."""
    from espnet3_prefect._internal.proc import run_command
    from espnet3_prefect.server.process import prefect_executable

    run_command(
        [prefect_executable(), "server", "database", "upgrade", "--yes"],
        env={**(os.environ if env is None else env), **database.server_environ()},
        timeout_s=timeout_s,
    )
