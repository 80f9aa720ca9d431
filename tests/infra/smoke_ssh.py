"""Smoke check: distributed.SSHCluster over the private sshd from sshd_up.sh -> 2 workers via ssh."""

import os
import sys
import tempfile
import time

from dask.distributed import Client, SSHCluster

STATE = os.environ.get("E3P_INFRA_DIR", os.path.join(tempfile.gettempdir(), "e3p-infra"))

if __name__ == "__main__":
    # Read when run, never when imported: a module of tests/ must import on a machine with no sshd.
    PORT = int(os.environ.get("E3P_SSH_PORT") or open(os.path.join(STATE, "ssh", "port")).read())
    KEY = os.environ.get("E3P_SSH_KEY", os.path.join(STATE, "ssh", "id_ed25519"))
    t0 = time.time()
    with (
        SSHCluster(
            ["127.0.0.1"] * 3,  # first host runs the scheduler, the others one worker each
            connect_options={"known_hosts": None, "port": PORT, "username": "root", "client_keys": [KEY]},
            scheduler_options={"host": "127.0.0.1", "port": 0, "dashboard_address": "127.0.0.1:0"},
            worker_options={"host": "127.0.0.1", "nthreads": 1, "local_directory": os.path.join(STATE, "dask-tmp")},
            remote_python=sys.executable,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        t1 = time.time()
        info = client.run(lambda: (os.getpid(), os.environ.get("SSH_CONNECTION")))
        print(f"2 workers after {t1 - t0:.1f} s: {info}")
        pids = {pid for pid, _ in info.values()}
        assert len(info) == 2 and len(pids) == 2 and os.getpid() not in pids, info
        assert all(conn and conn.startswith("127.0.0.1 ") for _, conn in info.values()), info  # started by sshd
        assert client.submit(sum, [1, 2, 3]).result() == 6
    print(f"closed, total {time.time() - t0:.1f} s -- SSH SMOKE OK")
