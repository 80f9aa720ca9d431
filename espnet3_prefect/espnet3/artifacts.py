"""Non-scalar inference outputs as artifact files, the way ESPnet3 202611 writes them.

An SCP line is ``<utt_id> <value>``. A field value that is a ``str``/``int``/``float``/``bool`` is
written verbatim; a NumPy scalar or a 0-d array/tensor becomes its ``.item()``; anything else is
written to ``<output_dir>/<field>/<utt_id><suffix>`` and the SCP line holds that path:

* ``numpy.ndarray`` or CPU tensor: ``.npy`` (``numpy.save``);
* ``dict``: ``.json`` (``json``, ``ensure_ascii=False, indent=2``, UTF-8);
* :class:`~espnet3_prefect.espnet3.contract.Audio`: ``.wav`` at the audio's rate (``soundfile.write``
  defaults, so 16-bit PCM), channels last;
* anything else, ``None`` included: ``.pkl`` (``pickle``, default protocol).

``output_artifacts: {<field>: {type: npy|json|pickle|wav, sample_rate: ...}}`` picks the format
(``wav`` needs ``sample_rate``), or ``{writer: {_target_: my.module.func, ...}}`` a function called
as ``func(value=, output_path=, **options)`` that returns the existing path it wrote. The suffix is
appended to the id, so ids with dots keep them. A top-level list/tuple is a ``TypeError`` (wrap it
in a dict); a CUDA tensor is a ``ValueError``.

With espnet3 importable (and :data:`espnet3_prefect.espnet3.contract.STANDALONE` unset), ESPnet3's own
``write_artifact`` / ``check_utt_id`` / materialize helper do the work; otherwise this module does,
writing the same bytes. torch is never imported here; soundfile only for ``.wav``.

Examples:
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = Path(tmp.name)
    >>> materialize_output_value("utt1", "hyp", "hello", out, None)
    'hello'
    >>> materialize_output_value("utt1", "score", np.float32(0.5), out, None)
    0.5
    >>> path = materialize_output_value("sp0.9-utt1", "meta", {"spk": "é"}, out, None)
    >>> Path(path).relative_to(out).as_posix(), Path(path).read_text(encoding="utf-8")
    ('meta/sp0.9-utt1.json', '{\\n  "spk": "é"\\n}')
    >>> tmp.cleanup()
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

from espnet3_prefect.espnet3 import contract as _contract
from espnet3_prefect.espnet3.audio import Audio, is_audio, upstream_audio

_SUFFIXES = {"wav": ".wav", "npy": ".npy", "json": ".json", "pickle": ".pkl"}


# --------------------------------------------------------------------------- delegation


def _upstream(module: str, attribute: str):
    """ESPnet3's ``module.attribute`` when it is importable and not switched off, else None."""
    if _contract.upstream_module() is None:
        return None
    return _import_upstream(module, attribute)


_UPSTREAM_CACHE: dict = {}


def _import_upstream(module: str, attribute: str):
    key = (module, attribute)
    if key not in _UPSTREAM_CACHE:
        try:
            import importlib

            _UPSTREAM_CACHE[key] = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            # not in this espnet3, or it needs a package this venv lacks (torch, soundfile, ...)
            _UPSTREAM_CACHE[key] = None
    return _UPSTREAM_CACHE[key]


# --------------------------------------------------------------------------- ids


def _check_utt_id_standalone(value: Any) -> str:
    name = str(value)
    if (
        not name
        or name in (".", "..")
        or any(c.isspace() for c in name)
        or "/" in name
        or "\\" in name
        or os.sep in name
    ):
        raise ValueError(
            f"utterance id {name!r} cannot be used: it starts an SCP line and names artifact files, "
            "so it must be non-empty, not '.' or '..', and hold no whitespace, '/' or '\\'"
        )
    return name


def check_utt_id(value: Any) -> str:
    """``str(value)``, refused (ValueError) if it cannot head an SCP line or name a file.

    Examples:
        >>> check_utt_id("sp0.9-utt1"), check_utt_id(7)
        ('sp0.9-utt1', '7')
        >>> check_utt_id("../x")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: ...
    """
    upstream = _upstream("espnet3.utils.scp_utils", "check_utt_id")
    return (upstream or _check_utt_id_standalone)(value)


# --------------------------------------------------------------------------- writing


def _torch_tensor_type():
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported by someone
    return None if torch is None else torch.Tensor


def _is_tensor(value: Any) -> bool:
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(value, tensor)


def _plain(config: Any) -> dict:
    if config is None:
        return {}
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and omegaconf.OmegaConf.is_config(config):
        return omegaconf.OmegaConf.to_container(config, resolve=True)
    return dict(config)


def default_artifact_type(value: Any) -> str:
    """The type a value is written as without ``output_artifacts``: npy, json or pickle.

    Examples:
        >>> default_artifact_type(np.zeros(2)), default_artifact_type({}), default_artifact_type(None)
        ('npy', 'json', 'pickle')
    """
    if _is_tensor(value) or isinstance(value, np.ndarray):
        return "npy"
    if isinstance(value, dict):
        return "json"
    return "pickle"


def _existing(path: Any) -> Path:
    if not isinstance(path, (str, Path)):
        raise TypeError(f"an artifact writer must return the path it wrote (str or Path), got {type(path).__name__}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"the artifact writer returned {str(path)!r}, which does not exist")
    return path


def _run_writer(value: Any, output_path: Path, writer: Any, options: dict) -> Path:
    writer = _plain(writer)
    if "_target_" not in writer:
        raise KeyError(
            f"output_artifacts writer for {output_path.as_posix()!r} needs a _target_ (a dotted function path)"
        )
    from hydra.utils import get_object

    function = get_object(writer.pop("_target_"))
    return _existing(function(value=value, output_path=output_path, **writer, **options))


def _write_builtin(value: Any, output_path: Path, type_name: str, options: dict) -> Path:
    if _is_tensor(value):
        if value.is_cuda:
            raise ValueError(
                f"cannot write {output_path.as_posix()!r} from a CUDA tensor: return it on the CPU "
                "(tensor.cpu()) from inference"
            )
        value = value.detach().cpu().numpy()
    if type_name not in _SUFFIXES:
        raise ValueError(
            f"output_artifacts type {type_name!r} for {output_path.as_posix()!r} is not one of {', '.join(_SUFFIXES)}"
        )
    # appended, not substituted: "sp0.9-utt1" must not lose ".9-utt1"
    output_path = output_path.with_name(output_path.name + _SUFFIXES[type_name])
    output_path.parent.mkdir(parents=True, exist_ok=True)
    if type_name == "wav":
        rate = options.get("sample_rate")
        if rate is None:
            raise ValueError(f"a wav artifact ({output_path.as_posix()!r}) needs output_artifacts.<field>.sample_rate")
        try:
            import soundfile
        except ImportError:
            raise ModuleNotFoundError(
                f"writing {output_path.as_posix()!r} needs soundfile: pip install soundfile", name="soundfile"
            ) from None
        soundfile.write(output_path, np.asarray(value), int(rate))
    elif type_name == "npy":
        np.save(output_path, np.asarray(value))
    elif type_name == "json":
        text = json.dumps(value, ensure_ascii=False, indent=2)  # serialized first: no half-written file
        with open(output_path, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        data = pickle.dumps(value)
        with open(output_path, "wb") as handle:
            handle.write(data)
    return _existing(output_path)


def _write_standalone(value: Any, output_path: Path, field_config: Any) -> Path:
    config = _plain(field_config)
    writer = config.get("writer")
    type_name = config.get("type")
    options = {key: item for key, item in config.items() if key not in ("type", "writer")}
    if writer is not None:
        return _run_writer(value, output_path, writer, options)
    return _write_builtin(value, output_path, type_name or default_artifact_type(value), options)


def write_artifact(value: Any, output_path: Path, field_config: dict | None = None) -> Path:
    """Write one artifact at ``output_path`` + the type's suffix; return the path written.

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> base = Path(tmp.name) / "vec" / "u.1"
        >>> path = write_artifact(np.arange(3, dtype=np.int16), base)
        >>> path.name, np.load(path).tolist()
        ('u.1.npy', [0, 1, 2])
        >>> write_artifact(np.zeros(3), base, {"type": "wav"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: ...
        >>> tmp.cleanup()
    """
    output_path = Path(output_path)
    upstream = _upstream("espnet3.utils.writer_utils", "write_artifact")
    if upstream is not None:
        return upstream(value, output_path, field_config=field_config)
    return _write_standalone(value, output_path, field_config)


def _materialize_standalone(idx_value, field_key, value, output_dir, artifact_config, write):
    if isinstance(value, (str, int, float, bool)):
        return value
    idx_value = check_utt_id(idx_value)
    if is_audio(value):
        config = dict(artifact_config or {})
        config.setdefault("type", "wav")
        config.setdefault("sample_rate", value.rate)
        # soundfile wants (samples, channels); Audio holds (channels, samples)
        transpose = config["type"] == "wav" and value.array.ndim == 2
        value = value.array.T if transpose else value.array
        artifact_config = config
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if _is_tensor(value) and value.dim() == 0:
        return value.item()
    if isinstance(value, (list, tuple)):
        raise TypeError(
            f"field {field_key!r} of utterance {idx_value!r} is a {type(value).__name__}: an output field "
            "holds one value; wrap structured content in a dict (written as JSON)"
        )
    target = Path(output_dir) / field_key
    target.mkdir(parents=True, exist_ok=True)
    return write(value, target / str(idx_value), field_config=artifact_config).as_posix()


def materialize_output_value(
    idx_value: Any, field_key: str, value: Any, output_dir: Path, artifact_config: dict | None
):
    """The value an SCP line holds for one field: the scalar itself, or the artifact's path.

    Examples:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> out = Path(tmp.name)
        >>> path = materialize_output_value("u1", "post", np.ones((2, 3), dtype=np.float32), out, None)
        >>> path.endswith("/post/u1.npy"), np.load(path).shape
        (True, (2, 3))
        >>> materialize_output_value("u1", "words", ["a", "b"], out, None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        TypeError: ...
        >>> tmp.cleanup()
    """
    upstream = _upstream("espnet3.systems.base.inference_runner", "_materialize_output_value")
    if upstream is not None:
        if isinstance(value, Audio):
            value = upstream_audio(value)  # ESPnet3 writes only its own Audio as wav
        return upstream(
            idx_value=idx_value,
            field_key=field_key,
            value=value,
            output_dir=Path(output_dir),
            artifact_config=artifact_config,
        )
    write = _upstream("espnet3.utils.writer_utils", "write_artifact") or _write_standalone_kw
    return _materialize_standalone(idx_value, field_key, value, output_dir, artifact_config, write)


def _write_standalone_kw(value, output_path, field_config=None):
    return _write_standalone(value, output_path, field_config)


__all__ = ["check_utt_id", "default_artifact_type", "materialize_output_value", "write_artifact"]
