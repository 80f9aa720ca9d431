"""``deploy-local --database``: a bad URL stops the command on one line before anything starts or is
written (no server, no remembered choice); the options exclude each other."""

from __future__ import annotations

import pytest

from espnet3_prefect.cli import main
from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://lab:secret@db.lab/prefect", "--database: the URL holds a password"),
        ("mysql://lab@db.lab/prefect", "is not a postgresql:// URL"),
        ("postgresql://db.lab/prefect", "must name a user, a host and a database"),
    ],
)
def test_a_bad_database_url_stops_before_anything_starts(tmp_path, capsys, url, said):
    home = tmp_path / "home"
    rc = main(["deploy-local", "--state-dir", str(home), "--project-dir", str(ROOT), "--database", url])
    err = capsys.readouterr().err
    assert rc == 2 and said in err and len(err.strip().splitlines()) == 1
    assert "secret" not in err
    assert sorted(p.name for p in home.iterdir()) == []  # no server, no database.json


def test_postgres_and_database_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["deploy-local", "--state-dir", str(tmp_path), "--postgres", "--database", "sqlite"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--api-processes", "0"], "--api-processes: 0 is not a positive number of API processes"),
        (["--api-processes", "2"], "--api-processes: 2 API processes need PostgreSQL; add --postgres or --database"),
        (
            ["--api-processes", "3", "--database", "postgresql://lab@db.lab/prefect", "--tls"],
            "--api-processes: 3 API processes serve HTTP only; drop --tls",
        ),
    ],
)
def test_api_processes_that_cannot_run_stop_before_anything_starts(tmp_path, capsys, options, said):
    home = tmp_path / "home"
    rc = main(["deploy-local", "--state-dir", str(home), "--project-dir", str(ROOT), *options])
    err = capsys.readouterr().err
    assert rc == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in home.iterdir()) == []  # no server, no Redis, no database.json
