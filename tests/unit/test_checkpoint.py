"""Checkpoints: epoch/step from names and contents, the config key a checkpoint fills, a closed torch
zip told from a half-written one, the per-checkpoint trend order and best; the watcher and the
state file against a real Prefect server (``latest`` mode, a pending event after a kill)."""

from __future__ import annotations

import io
import json
import uuid

import pytest
from omegaconf import OmegaConf

from espnet3_prefect.checkpoints.checkpoint import checkpoint_info, parse_name, resolve_key, zip_complete
from espnet3_prefect.checkpoints.trend import best_points, checkpoint_points
from espnet3_prefect.errors import ConfigError
from tests.helpers.prefect_db import seed


def torch_bytes(obj, legacy: bool = False) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer, _use_new_zipfile_serialization=not legacy)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "name, epoch, step",
    [
        ("epoch=3-step=1200.ckpt", 3, 1200),
        ("3epoch.pth", 3, None),
        ("step1200", None, 1200),
        ("checkpoint_epoch_7.pt", 7, None),
        ("model-step_50.pt", None, 50),
        ("last.ckpt", None, None),
        ("valid.acc.ave_10best.pth", None, None),
    ],
)
def test_epoch_and_step_from_the_name(name, epoch, step):
    assert parse_name(name) == {"epoch": epoch, "step": step}


def test_epoch_and_step_from_the_checkpoint_when_the_name_does_not_say(tmp_path):
    import torch

    (tmp_path / "last.ckpt").write_bytes(
        torch_bytes({"state_dict": {"w": torch.zeros(2)}, "epoch": 4, "global_step": 880})
    )
    info = checkpoint_info(tmp_path / "last.ckpt")
    assert (info["epoch"], info["step"], info["bytes"]) == (4, 880, (tmp_path / "last.ckpt").stat().st_size)
    (tmp_path / "epoch=9.ckpt").write_bytes((tmp_path / "last.ckpt").read_bytes())
    assert (
        checkpoint_info(tmp_path / "epoch=9.ckpt")["epoch"],
        checkpoint_info(tmp_path / "epoch=9.ckpt")["step"],
    ) == (9, 880)  # the name wins, the contents fill the rest
    (tmp_path / "notes.pth").write_text("not torch")
    assert checkpoint_info(tmp_path / "notes.pth")["step"] is None
    with pytest.raises(ConfigError, match="checkpoint: .*nope.ckpt: no such file"):
        checkpoint_info(tmp_path / "nope.ckpt")


def test_a_torch_zip_is_complete_only_once_closed(tmp_path):
    import torch

    data = torch_bytes({"w": torch.arange(5000.0)})
    path = tmp_path / "a.ckpt"
    for cut in (len(data) // 3, len(data) - 23, len(data) - 1):
        path.write_bytes(data[:cut])
        assert not zip_complete(path), cut
    path.write_bytes(data)
    assert zip_complete(path)
    path.write_bytes(torch_bytes({"w": torch.zeros(3)}, legacy=True))
    assert not zip_complete(path)  # the old format: only the settle time tells


def test_the_checkpoint_key_of_a_recipe():
    demo = OmegaConf.create({"model": {"_target_": "dtmf_demo.recipe.DTMFRecognizer", "model_file": None}})
    s2t = OmegaConf.create({"model": {"_target_": "espnet2.bin.asr_inference.Speech2Text", "asr_train_config": "c"}})
    assert resolve_key(demo, None) == "model.model_file"
    assert resolve_key(s2t, None) == "model.asr_model_file"  # a Speech2Text's, also when the key is absent
    assert resolve_key(s2t, "model.lm_file") == "model.lm_file"
    with pytest.raises(ConfigError, match="checkpoint_key: 'dataset.x' must name a key under model."):
        resolve_key(s2t, "dataset.x")
    with pytest.raises(ConfigError, match="checkpoint_key: cannot tell which key of the model config"):
        resolve_key(OmegaConf.create({"model": {"_target_": "my.Model"}}), None)


def test_the_trend_is_in_checkpoint_order_one_point_per_content_best_marked():
    def record(name, step, sha, wer, fp="cfg"):
        return {
            "checkpoint": {"name": name, "step": step, "epoch": None, "sha256": sha},
            "config_fingerprint": fp,
            "headline": {"WER": {"test": wer}, "BLEU": {"test": 100 - wer}},
            "run_time": "t",
        }

    records = [
        record("c.ckpt", 300, "c", 5.0),
        record("a.ckpt", 100, "a", 9.0),
        record("b.ckpt", 200, "b", 4.0),
        record("a.ckpt", 100, "a", 8.0),
        record("z.ckpt", 50, "z", 1.0, fp="other config"),
    ]
    points = checkpoint_points(records, "cfg")
    assert [p["checkpoint"]["name"] for p in points] == ["a.ckpt", "b.ckpt", "c.ckpt"]
    assert points[0]["headline"]["WER"]["test"] == 8.0  # the latest score of a content
    assert best_points(points) == {("WER", "test"): 1, ("BLEU", "test"): 1}


def test_watcher_latest_mode_and_a_pending_event_left_by_a_kill(prefect_server, tmp_path):
    """A real server: ``latest`` sends only the newest complete checkpoint; a state file with a pending
    event (the sender killed after writing it) sends that event id once, and nothing after."""
    import torch
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    from espnet3_prefect.checkpoints.events import EVENT_NAME, EmittedState, event_fields
    from espnet3_prefect.checkpoints.poller import Watcher

    exp = tmp_path / "exp"
    exp.mkdir()
    for step in (100, 200, 300):
        (exp / f"step{step}.ckpt").write_bytes(torch_bytes({"w": torch.full((4,), float(step))}))
    (exp / "notes.txt").write_text("not a checkpoint")
    with EmittedState(tmp_path / "state.json") as state:
        watcher = Watcher(exp, state, mode="latest", settle_s=60)
        sent = watcher.poll()
        assert [f["payload"]["name"] for f in sent] == ["step300.ckpt"]
        assert watcher.poll() == []
        with pytest.raises(Exception, match="another checkpoint watcher or sender holds it"):
            EmittedState(tmp_path / "state.json").__enter__()
    saved = json.loads((tmp_path / "state.json").read_text())
    assert len(saved["emitted"]) == 1 and len(saved["superseded"]) == 2 and not saved["pending"]

    # a sender killed between "pending" and "emitted": the restart sends the same event id, once
    (exp / "step400.ckpt").write_bytes(torch_bytes({"w": torch.full((4,), 400.0)}))
    info = checkpoint_info(exp / "step400.ckpt")
    event_id = str(uuid.uuid4())
    saved["pending"][info["sha256"]] = {
        "event_id": event_id,
        "path": info["path"],
        "fields": event_fields(info, exp, event_id),
        "since": "t",
    }
    (tmp_path / "state.json").write_text(json.dumps(saved))
    with EmittedState(tmp_path / "state.json") as state:
        state.flush_pending()
        assert Watcher(exp, state, settle_s=60).poll() == []  # step400 went out as the pending event
    with get_client(sync_client=True) as client:
        events = client.read_events(EventFilter(event=EventNameFilter(name=[EVENT_NAME])), limit=50).events
    names = sorted(e.payload["name"] for e in events if e.payload.get("exp_dir") == str(exp.resolve()))
    assert names == ["step300.ckpt", "step400.ckpt"]
    assert event_id in {str(e.id) for e in events}
    assert [e.resource.id for e in events if e.payload["name"] == "step400.ckpt"] == [
        f"espnet3.checkpoint.{info['sha256']}"
    ]


@pytest.mark.slow
def test_events_reach_a_server_that_asks_for_basic_auth_over_https(tmp_path):
    """A server with basic auth over HTTPS (as ``deploy-local --host`` serves one): the event is sent,
    verified with the server's certificate, and read back with the credential."""
    import torch
    from prefect.events.filters import EventFilter, EventNameFilter

    from espnet3_prefect.checkpoints.events import EVENT_NAME, EmittedState, prefect_settings
    from espnet3_prefect.disk.client_file import ClientCredentials
    from espnet3_prefect.server.https import ServerTLS
    from espnet3_prefect.server.process import start_server, stop_server

    auth = "e3p:" + uuid.uuid4().hex
    home = seed(tmp_path / "home")
    tls = ServerTLS.of(home).create("127.0.0.1")
    proc, url = start_server(home, ui=False, auth_string=auth, tls=tls)
    assert url.startswith("https://")
    cert = str(tls.ca_file)
    try:
        (tmp_path / "step1.ckpt").write_bytes(torch_bytes({"w": torch.ones(3)}))
        info = checkpoint_info(tmp_path / "step1.ckpt")
        with (
            prefect_settings(ClientCredentials(url, None, ssl_cert_file=cert)),
            EmittedState(tmp_path / "no-auth.json") as state,
        ):
            with pytest.raises(Exception):  # refused without the credential: nothing recorded as sent
                state.emit([info], tmp_path)
        left = json.loads((tmp_path / "no-auth.json").read_text())
        assert not left["emitted"] and list(left["pending"]) == [info["sha256"]]  # sent again on the next start
        with (
            prefect_settings(ClientCredentials(url, auth, ssl_cert_file=cert)),
            EmittedState(tmp_path / "state.json") as state,
        ):
            [sent] = state.emit([info], tmp_path)
        with ClientCredentials(url, auth, ssl_cert_file=cert).sync_client() as client:
            events = client.read_events(EventFilter(event=EventNameFilter(name=[EVENT_NAME])), limit=50).events
        assert [str(e.id) for e in events] == [sent["id"]]
    finally:
        stop_server(proc.pid)
