"""ESPnet3's F5-TTS inference model needs a Vocos vocoder: checked on the driver before anything starts.

``espnet3.systems.f5tts.inference.F5TTSInference`` loads it in its constructor, i.e. in every worker
after the cluster is up: from ``model.vocoder_path`` (a local folder with ``config.yaml`` and
``pytorch_model.bin``) or, with the key unset, from the Hugging Face Hub (``charactr/vocos-mel-24khz``).
Upstream a missing folder or an unreachable hub is a traceback per worker (and a stale shard lock);
here it is one line naming ``model.vocoder_path`` before a server or cluster starts.

>>> check_vocoder({"model": {"_target_": "my.Model"}})  # any other model: nothing to check
>>> check_vocoder({"model": {"_target_": F5TTS_INFERENCE, "vocoder_path": "/x"}})
Traceback (most recent call last):
...
espnet3_prefect.errors.ConfigError: model.vocoder_path: /x is no Vocos folder (no config.yaml, pytorch_model.bin there)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from espnet3_prefect.errors import ConfigError

F5TTS_INFERENCE = "espnet3.systems.f5tts.inference.F5TTSInference"
VOCOS_FILES = ("config.yaml", "pytorch_model.bin")
# espnet3.systems.f5tts.VOCOS_DEFAULT_MODEL in 202611 (read from there when it imports).
VOCOS_HUB_DEFAULT = "charactr/vocos-mel-24khz"
HUB_CONNECT_TIMEOUT_S = 3.0
OFFLINE_VALUES = {"1", "on", "yes", "true"}


def check_vocoder(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` (one line naming ``model.vocoder_path``) when the config's model is
    ``F5TTSInference`` and its vocoder cannot be loaded: the folder lacks a file, or the key is unset
    and the hub's checkpoint is neither in the local cache nor reachable."""
    model = config.get("model") if isinstance(config, Mapping) else None
    if not isinstance(model, Mapping) or model.get("_target_") != F5TTS_INFERENCE:
        return
    path = model.get("vocoder_path")
    if path:
        folder = Path(str(path))
        if not folder.is_absolute() and config.get("recipe_dir"):
            folder = Path(str(config["recipe_dir"])) / folder  # the provider builds the model from there
        missing = [name for name in VOCOS_FILES if not (folder / name).is_file()]
        if missing:
            raise ConfigError(f"model.vocoder_path: {path} is no Vocos folder (no {', '.join(missing)} there)")
        return
    repo = _hub_default()
    if _cached(repo):
        return
    why = hub_unreachable()
    if why:
        raise ConfigError(
            f"model.vocoder_path: unset, so F5TTSInference would download the Vocos vocoder {repo} from the "
            f"Hugging Face Hub, which {why}; set it to a local folder holding {' and '.join(VOCOS_FILES)}"
        )


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (``HF_HUB_OFFLINE`` set, or no TCP connection to ``HF_ENDPOINT``'s
    host within :data:`HUB_CONNECT_TIMEOUT_S`), or None when it answers."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in OFFLINE_VALUES:
        return "is switched off here (HF_HUB_OFFLINE is set)"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"cannot be reached ({host}:{port}: {exc.strerror or type(exc).__name__})"


def _hub_default() -> str:
    try:
        from espnet3.systems.f5tts import VOCOS_DEFAULT_MODEL
    except ImportError:
        return VOCOS_HUB_DEFAULT
    return str(VOCOS_DEFAULT_MODEL)


def _cached(repo: str) -> bool:
    """Both files of ``repo`` in the local Hugging Face cache (huggingface_hub absent: no)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return all(isinstance(try_to_load_from_cache(repo, name), str) for name in VOCOS_FILES)


__all__ = ["F5TTS_INFERENCE", "VOCOS_HUB_DEFAULT", "check_vocoder", "hub_unreachable"]
