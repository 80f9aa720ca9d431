from __future__ import annotations

import json
import os
import socket

import pytest

from espnet3_prefect import BadInputError, InferenceRunner
from espnet3_prefect._internal.scp import read_scp
from espnet3_prefect.pipeline.lock import LOCK_NAME, LockedError, acquire


def _write(tmp_path, records):
    writers = InferenceRunner.open_writers(tmp_path)
    for record in records:
        InferenceRunner.write_record(writers, record, {}, idx_key="utt_id")
    InferenceRunner.close_writers(writers, {})


def test_scp_keeps_spaces_and_non_ascii_verbatim(tmp_path):
    values = {"u1": "  leading", "u2": "trailing  ", "u3": "ünïcödé 漢字", "u4": "", "u5": "a\tb"}
    _write(tmp_path, [{"utt_id": k, "hyp": v} for k, v in values.items()])
    assert read_scp(tmp_path / "hyp.scp") == values


@pytest.mark.parametrize("value", ["two\nlines", "cr\rhere"])
def test_line_breaks_in_values_are_rejected_naming_utt_and_field(tmp_path, value):
    with pytest.raises(BadInputError, match="utterance 'u1': field 'hyp' contains a line break"):
        _write(tmp_path, [{"utt_id": "u1", "hyp": value}])


@pytest.mark.parametrize("utt", ["", "a b", "x/y", "..", "."])
def test_unsafe_utt_ids_are_rejected(tmp_path, utt):
    with pytest.raises(BadInputError, match="utt_id"):
        _write(tmp_path, [{"utt_id": utt, "hyp": "h"}])


def test_second_run_is_refused_with_the_holders_pid_and_host(tmp_path):
    lock = acquire(tmp_path, "run-1")
    try:
        with pytest.raises(
            LockedError, match=f"in use by pid {os.getpid()} on host {socket.gethostname()} \\(flow run run-1"
        ):
            acquire(tmp_path, "run-2")
    finally:
        lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_of_a_dead_process_is_taken_over_and_reported(tmp_path):
    (tmp_path / LOCK_NAME).write_text(
        json.dumps({"pid": 2**22 + 7, "host": socket.gethostname(), "flow_run_id": "dead-run"})
    )
    lock = acquire(tmp_path, "run-2")
    assert lock.stale_holder["flow_run_id"] == "dead-run"
    assert json.loads((tmp_path / LOCK_NAME).read_text())["flow_run_id"] == "run-2"
    lock.release()


def test_half_written_lock_is_recovered_once_it_is_old(tmp_path):
    path = tmp_path / LOCK_NAME
    path.write_text('{"pid": 12')
    with pytest.raises(LockedError):  # may be being written right now
        acquire(tmp_path)
    os.utime(path, (0, 0))
    acquire(tmp_path).release()
