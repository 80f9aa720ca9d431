"""Runners apply a static ``forward(idx, **env)`` over indices and write what it returns.

ESPnet3 contracts kept: ``forward`` is a staticmethod receiving an int, or a list of ints when
``batch_size`` is set; env entries are injected by name; writer hooks ``open_writers``,
``write_record``, ``close_writers`` run per shard and ``merge(shard_dirs)`` combines shards into
``output_dir``. Where the hooks are not overridden, records go to ``results.jsonl``.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from .envcall import call_with_env
from .errors import BadInputError, ConfigError, ItemError, one_line
from .merge import concat_files


def check_batch_size(value: Any) -> int | None:
    """``batch_size`` is a positive int or None.

    >>> check_batch_size(None), check_batch_size(8)
    (None, 8)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"batch_size: must be a positive integer or null, got {value!r}")
    return value


def _call_hook(fn, *args: Any, env: dict, **explicit: Any) -> Any:
    """Hooks from older ESPnet3 code take fewer arguments (``close_writers(writers)``)."""
    params = inspect.signature(fn).parameters
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        args = args[: len(positional)]
    return call_with_env(fn, *args, env=env, **explicit)


class BaseRunner:
    """Subclass and implement the static :meth:`forward`.

    >>> class Square(BaseRunner):
    ...     @staticmethod
    ...     def forward(idx, **env): return {"idx": idx, "sq": idx * idx}
    """

    def __init__(self, provider: Any = None, *, batch_size: int | None = None,
                 output_dir: str | Path | None = None, resume: bool = True):
        self.provider = provider
        self.batch_size = check_batch_size(batch_size)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.resume = bool(resume)

    @staticmethod
    def forward(idx: Any, **env: Any) -> Any:
        """Compute one item (``idx`` an int) or one batch (``idx`` a list of ints)."""
        raise NotImplementedError("runners must implement a static forward(idx, **env)")

    # -- writer hooks ------------------------------------------------------------------------
    @staticmethod
    def open_writers(shard_dir: Path, **env: Any) -> Any:
        return {"results": (Path(shard_dir) / "results.jsonl").open("w", encoding="utf-8")}

    @staticmethod
    def write_record(writers: Any, result: Any, state: dict, **env: Any) -> None:
        writers["results"].write(json.dumps(result, sort_keys=True, default=str) + "\n")

    @staticmethod
    def close_writers(writers: Any, state: dict | None = None, **env: Any) -> None:
        for handle in writers.values():
            handle.close()

    def merge(self, shard_dirs: Sequence[Path]) -> Any:
        """Combine shard outputs into ``output_dir`` (default: concatenate ``results.jsonl``)."""
        concat_files([Path(d) / "results.jsonl" for d in shard_dirs], self._out() / "results.jsonl")
        return {"results.jsonl": str(self._out() / "results.jsonl")}

    # -- running -----------------------------------------------------------------------------
    def batches(self, indices: Iterable[int]) -> Iterator[Any]:
        """Indices in order: single ints, or lists of ``batch_size`` ints."""
        if self.batch_size is None:
            yield from indices
            return
        batch: list[int] = []
        for idx in indices:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def write_shard(self, shard_dir: Path, indices: Iterable[int], env: dict, shard_id: int = 0,
                    on_error: str = "fail") -> tuple[int, list[dict]]:
        """Run ``forward`` over ``indices`` in order and write every result into ``shard_dir``.

        A failing batch is re-run item by item to find the failing item. A failing item raises
        :class:`ItemError` naming it (``on_error="fail"``) or is left out of the outputs and
        returned in the failure list (``on_error="skip"``). Returns (items handled, failures).
        """
        cls = type(self)
        state = {"shard_id": shard_id, "shard_dir": str(shard_dir), "count": 0}
        failures: list[dict] = []
        writers = _call_hook(cls.open_writers, Path(shard_dir), env=env)
        try:
            for item in self.batches(indices):
                for result in self._forward(item, env, on_error, failures):
                    _call_hook(cls.write_record, writers, result, state, env=env)
                state["count"] += len(item) if isinstance(item, list) else 1
        finally:
            _call_hook(cls.close_writers, writers, state, env=env)
        return state["count"], failures

    def _forward(self, item: Any, env: dict, on_error: str, failures: list[dict]) -> list[Any]:
        forward = type(self).forward
        try:
            return [call_with_env(forward, item, env=env)]
        except ConfigError:
            raise
        except Exception as exc:
            if isinstance(item, list):  # find the failing item(s) of the batch
                return [r for idx in item for r in self._forward(idx, env, on_error, failures)]
            label = _item_label(item, env)
            if on_error != "skip":
                raise ItemError(f"{label}: {type(exc).__name__}: {one_line(exc)}") from exc
            failures.append({"idx": item, "item": label, "error": f"{type(exc).__name__}: {one_line(exc)}"})
            return []

    def __call__(self, indices: Iterable[int]) -> Any:
        """Run everything in this process (no Dask, no Prefect) and merge; for quick checks."""
        out = self._out()
        env = self.provider.build_env_local()
        shard_dir = out / "split.0"
        shard_dir.mkdir(parents=True, exist_ok=True)
        self.write_shard(shard_dir, list(indices), env)
        return self.merge([shard_dir])

    def _out(self) -> Path:
        if self.output_dir is None:
            raise ConfigError("runner.output_dir: not set; the stage sets it to <inference_dir>/<test_set>")
        return self.output_dir


def _load_output_fn(path: str | None):
    if path is None or callable(path):
        return path
    module_name, _, attr = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"output_fn: cannot import {path!r}: {one_line(exc)}") from None


def _item_label(idx: int, env: dict) -> str:
    """``item 7 (utt_id='u7')`` when the dataset can tell the utterance, else ``item 7``."""
    key = env.get("idx_key") or "utt_id"
    try:
        return _utt_label(env["dataset"][idx], idx, key)
    except Exception:
        return f"item {idx}"


def _utt_label(item: Any, idx: Any, idx_key: str) -> str:
    utt = item.get(idx_key) if isinstance(item, dict) else None
    return f"item {idx} ({idx_key}={utt!r})" if utt is not None else f"item {idx}"


class InferenceRunner(BaseRunner):
    """Runs ``model`` on ``dataset[idx][input_key]`` and writes one ``<field>.scp`` per output key.

    ``input_key``, ``output_fn`` (dotted path), ``output_keys`` and ``idx_key`` come from the
    stage config through the env, as in ESPnet3.
    """

    def __init__(self, provider: Any = None, *, idx_key: str = "utt_id", hyp_key: Any = None,
                 ref_key: Any = None, **kwargs: Any):
        super().__init__(provider, **kwargs)
        self.idx_key = idx_key
        self.hyp_key = hyp_key
        self.ref_key = ref_key

    @staticmethod
    def forward(idx: Any, dataset: Any = None, model: Any = None, input_key: Any = None,
                output_fn: Any = None, idx_key: str = "utt_id", model_kwargs: dict | None = None,
                **env: Any) -> Any:
        keys = [input_key] if isinstance(input_key, str) else list(input_key or [])
        if not keys:
            raise ConfigError("input_key: missing or empty; name the dataset field the model reads")
        fn = _load_output_fn(output_fn)
        batch = isinstance(idx, (list, tuple))
        items = [dataset[i] for i in idx] if batch else [dataset[idx]]
        indices = list(idx) if batch else [idx]
        for item, i in zip(items, indices):
            missing = [k for k in keys if not isinstance(item, dict) or k not in item]
            if missing:
                have = ", ".join(sorted(item)) if isinstance(item, dict) else type(item).__name__
                raise BadInputError(f"{_utt_label(item, i, idx_key)}: has no input_key {missing[0]!r} (it has: {have})")
        inputs = {k: ([it[k] for it in items] if batch else items[0][k]) for k in keys}
        try:
            out = model(**inputs, **(model_kwargs or {}))
        except Exception as exc:
            if batch:
                raise type(exc)(f"model failed on a batch of {len(indices)} items (idx {indices[0]}..{indices[-1]}): "
                                f"{one_line(exc)}; set batch_size: null if the model takes single items") from exc
            raise
        if fn is None:
            return out
        return fn(data=items if batch else items[0], model_output=out, idx=idx)

    @staticmethod
    def open_writers(shard_dir: Path, **env: Any) -> dict:
        return {"dir": Path(shard_dir), "scp": {}}

    @staticmethod
    def write_record(writers: dict, result: Any, state: dict, idx_key: str = "utt_id",
                     output_keys: Any = None, **env: Any) -> None:
        records = result if isinstance(result, (list, tuple)) else [result]
        fields_wanted = [output_keys] if isinstance(output_keys, str) else output_keys
        for record in records:
            utt = _check_record(record, idx_key)
            fields = list(fields_wanted) if fields_wanted else [k for k in record if k != idx_key]
            for field in fields:
                if field not in record:
                    raise BadInputError(f"utterance {utt!r}: output has no field {field!r} listed in output_keys")
                handle = writers["scp"].get(field)
                if handle is None:
                    handle = writers["scp"][field] = (writers["dir"] / f"{field}.scp").open("w", encoding="utf-8")
                handle.write(f"{utt} {_scp_value(record[field], utt, field)}\n")

    @staticmethod
    def close_writers(writers: dict, state: dict | None = None, **env: Any) -> None:
        for handle in writers["scp"].values():
            handle.close()
        (writers["dir"] / "field_keys.txt").write_text("".join(f"{k}\n" for k in writers["scp"]), encoding="utf-8")

    def merge(self, shard_dirs: Sequence[Path]) -> dict[str, str]:
        """Concatenate each field's shard SCPs, in shard order, into ``output_dir/<field>.scp``."""
        fields: list[str] = []
        for shard_dir in shard_dirs:
            for line in (Path(shard_dir) / "field_keys.txt").read_text(encoding="utf-8").split():
                if line not in fields:
                    fields.append(line)
        out = {}
        for field in fields:
            parts = [Path(d) / f"{field}.scp" for d in shard_dirs]
            concat_files([p for p in parts if p.exists()], self._out() / f"{field}.scp")
            out[field] = str(self._out() / f"{field}.scp")
        return out


def check_utt_id(utt: Any, idx_key: str = "utt_id") -> str:
    """An utt_id is a non-empty string (or int) with no whitespace, no '/' and not '.' or '..'."""
    if isinstance(utt, int) and not isinstance(utt, bool):
        utt = str(utt)
    if not isinstance(utt, str) or not utt:
        raise BadInputError(f"{idx_key} {utt!r}: must be a non-empty string")
    if any(ch.isspace() for ch in utt) or "/" in utt or utt in (".", ".."):
        raise BadInputError(f"{idx_key} {utt!r}: must not contain whitespace or '/', nor be '.' or '..'")
    return utt


def _check_record(record: Any, idx_key: str) -> str:
    if not isinstance(record, dict):
        raise BadInputError(f"forward() output must be a dict with {idx_key!r}, got {type(record).__name__}: {one_line(repr(record))[:120]}")
    if idx_key not in record:
        raise BadInputError(f"forward() output has no {idx_key!r} key (keys: {', '.join(map(str, record))})")
    return check_utt_id(record[idx_key], idx_key)


def _scp_value(value: Any, utt: str, field: str) -> str:
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy / torch scalars
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        if not isinstance(value, bool):
            raise BadInputError(f"utterance {utt!r}: field {field!r} has a {type(value).__name__}; SCP values must be str, int, float or bool")
    text = str(value)
    if "\n" in text or "\r" in text:
        raise BadInputError(f"utterance {utt!r}: field {field!r} contains a line break; SCP values must be one line")
    return text
