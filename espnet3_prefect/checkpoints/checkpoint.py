"""A checkpoint as ``evaluate`` records it: path, content hash, epoch/step; the config key it fills.

The epoch and step come from the file name when it tells them (Lightning's ``epoch=3-step=1200.ckpt``,
ESPnet2's ``3epoch.pth``, ``step1200.pt``), else from the checkpoint's own ``epoch``/``global_step``
entries when it is a torch file that holds them (read with ``weights_only``, memory-mapped).

>>> parse_name("epoch=3-step=1200.ckpt"), parse_name("3epoch.pth"), parse_name("model_step1200.pt")
({'epoch': 3, 'step': 1200}, {'epoch': 3, 'step': None}, {'epoch': None, 'step': 1200})
>>> parse_name("valid.acc.ave_10best.pth")
{'epoch': None, 'step': None}
"""

from __future__ import annotations

import re
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect._internal.atomic import file_digest
from espnet3_prefect.errors import ConfigError

#: model-config keys a checkpoint path fills, tried in this order when ``checkpoint_key`` is not given:
#: ESPnet's ``Speech2Text`` (and its kin) name the file ``asr_model_file``; the demo ``model_file``
KNOWN_KEYS = ("model.asr_model_file", "model.model_file", "model.checkpoint", "model.ckpt_path")
_EPOCH = (re.compile(r"epoch[=_\-]?(\d+)", re.I), re.compile(r"(\d+)[_\-]?epoch", re.I))
_STEP = (re.compile(r"(?:global_)?step[=_\-]?(\d+)", re.I), re.compile(r"(\d+)[_\-]?steps?\b", re.I))


def parse_name(name: str) -> dict[str, int | None]:
    """``{"epoch", "step"}`` read from a checkpoint's file name (None where it does not say)."""
    found: dict[str, int | None] = {"epoch": None, "step": None}
    for key, patterns in (("epoch", _EPOCH), ("step", _STEP)):
        for pattern in patterns:
            match = pattern.search(name)
            if match:
                found[key] = int(match.group(1))
                break
    return found


def _from_contents(path: Path) -> dict[str, int | None]:
    """``epoch``/``global_step`` of a torch checkpoint dict, when loadable without running code."""
    try:
        import torch

        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zip file: mmap needs one
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # not torch's, or it holds objects weights_only refuses: the name is all we know
        return {"epoch": None, "step": None}
    if not isinstance(data, dict):
        return {"epoch": None, "step": None}

    def integer(value: Any) -> int | None:
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    return {"epoch": integer(data.get("epoch")), "step": integer(data.get("global_step", data.get("step")))}


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """What a score records of its checkpoint: path, name, bytes, mtime, sha256, epoch, step."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"checkpoint: {path}: no such file")
    file = file.resolve()
    stat = file.stat()
    info: dict[str, Any] = {
        "path": str(file),
        "name": file.name,
        **file_digest(file),
        "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(timespec="seconds"),
    }
    numbers = parse_name(file.name)
    if numbers["epoch"] is None or numbers["step"] is None:
        inside = _from_contents(file)
        numbers = {k: numbers[k] if numbers[k] is not None else inside[k] for k in numbers}
    info.update(numbers)
    return info


def describe_checkpoint(info: dict) -> str:
    """``epoch=3-step=1200.ckpt (epoch 3, step 1200, sha256 1a2b3c4d5e6f)``."""
    parts = [f"{k} {info[k]}" for k in ("epoch", "step") if info.get(k) is not None]
    return f"{info['name']} ({', '.join([*parts, 'sha256 ' + info['sha256'][:12]])})"


def resolve_key(cfg: DictConfig, key: str | None) -> str:
    """The dotted config key the checkpoint path fills: ``key`` itself (it must lie under ``model``
    or ``provider.params``), else the first of :data:`KNOWN_KEYS` the config has, else
    ``model.asr_model_file`` for a ``Speech2Text`` model."""
    if key:
        key = key.strip()
        if not key.startswith(("model.", "provider.params.")):
            raise ConfigError(f"checkpoint_key: {key!r} must name a key under model. or provider.params.")
        return key
    for known in KNOWN_KEYS:
        parent, leaf = known.rsplit(".", 1)
        node = OmegaConf.select(cfg, parent)
        if isinstance(node, DictConfig) and leaf in node:
            return known
    target = str(OmegaConf.select(cfg, "model._target_") or "")
    if target.endswith("Speech2Text"):
        return "model.asr_model_file"
    raise ConfigError(
        f"checkpoint_key: cannot tell which key of the model config ({target or 'no _target_'}) "
        f"names its checkpoint file; pass checkpoint_key (e.g. model.asr_model_file)"
    )


def order_field(infos: list[dict]) -> str | None:
    """The field every checkpoint of ``infos`` has, to order them by: ``step``, else ``epoch``, else None
    (then the order they were scored in).

    >>> order_field([{"step": 2, "epoch": 1}, {"step": 1, "epoch": None}]), order_field([{"epoch": None}])
    ('step', None)
    """
    for field in ("step", "epoch"):
        if infos and all(info.get(field) is not None for info in infos):
            return field
    return None


def zip_complete(path: Path) -> bool:
    """True when ``path`` is a zip archive (torch's format since 1.6) whose end record is its last
    bytes and whose central directory ends right before it: the writer has closed it. A file still
    being written has no end record at its end yet."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            if size < 22:
                return False
            tail_len = min(size, 22 + 65535)
            handle.seek(size - tail_len)
            tail = handle.read(tail_len)
    except OSError:
        return False
    base = size - tail_len
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return False
    _, _, _, _, entries, cd_size, cd_offset, comment_len = struct.unpack("<IHHHHIIH", tail[at : at + 22])
    if at + 22 + comment_len != tail_len:
        return False
    locator = at - 20  # zip64 (torch always writes it): a locator right before the end record
    if locator >= 0 and tail[locator : locator + 4] == b"PK\x06\x07":
        record = struct.unpack("<Q", tail[locator + 8 : locator + 16])[0] - base
        if record < 0 or tail[record : record + 4] != b"PK\x06\x06":
            return False
        cd_size, cd_offset = struct.unpack("<QQ", tail[record + 40 : record + 56])
        return cd_offset + cd_size == base + record
    return cd_offset + cd_size == base + at
