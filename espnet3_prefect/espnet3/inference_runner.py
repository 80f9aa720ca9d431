"""``InferenceRunner``: ESPnet3 202611's inference runner contract, standalone.

``forward`` reads ``dataset[idx][input_key]``, applies the config's ``contract:`` (when set), calls
``model(**inputs, **model_kwargs)``, the legacy ``output_fn`` (``output_fn_path``), then
``format_output``; ``write_record`` streams each named output into ``split.N/<field>.scp`` (values that
are not scalars become artifacts under ``split.N/<field>/<id>.<ext>``, the line holding the path);
``merge`` concatenates each field's shard SCPs, in shard order, into ``output_dir/[shard_subdir]``.

>>> InferenceRunner.forward(0, dataset=[{"utt_id": "a", "x": 2}], model=lambda x: {"utt_id": "a", "y": x * x},
...                         input_key="x")
{'utt_id': 'a', 'y': 4}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from espnet3_prefect.config.targets import load_callable
from espnet3_prefect.disk.concat import concat_files
from espnet3_prefect.errors import BadInputError, ConfigError, named, one_line
from espnet3_prefect.espnet3.artifacts import check_utt_id, materialize_output_value
from espnet3_prefect.espnet3.contract import (
    prepare_inference_inputs,
    resolve_inference_contract,
    validate_inference_outputs,
)
from espnet3_prefect.espnet3.runner import BaseRunner


def key_list(keys: Any) -> list[str]:
    """None -> [], one key -> [key], a list-like -> a list.

    >>> key_list(None), key_list("hyp"), key_list(("hyp", "ref"))
    ([], ['hyp'], ['hyp', 'ref'])
    """
    if keys is None:
        return []
    if isinstance(keys, str):
        return [keys]
    return list(keys)


def _as_key_or_list(keys: Any) -> Any:
    return keys if keys is None or isinstance(keys, str) else list(keys)


def _flatten(result: Any) -> list[Any]:
    """Results as a flat list: a batch's list (nested lists too) or one result."""
    if isinstance(result, list):
        return [out for item in result for out in _flatten(item)]
    return [result]


def _is_out_of_memory(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name in ("OutOfMemoryError", "MemoryError") or "out of memory" in str(exc).lower()


class InferenceRunner(BaseRunner):
    """Runs ``model`` over ``dataset`` items and writes one ``<field>.scp`` per output field.

    ``idx_key`` names the sample identifier heading every SCP line; ``hyp_key``/``ref_key`` (a key
    or a list) are keys every output must carry. Other arguments go to :class:`BaseRunner`.
    """

    def __init__(
        self,
        provider: Any,
        idx_key: str = "utt_id",
        hyp_key: str | Sequence[str] = "hyp",
        ref_key: str | Sequence[str] = "ref",
        **kwargs: Any,
    ) -> None:
        super().__init__(provider, **kwargs)
        self.idx_key = idx_key
        self.hyp_key = _as_key_or_list(hyp_key)
        self.ref_key = _as_key_or_list(ref_key)

    def resolve_idx_key(self, output: dict[str, Any]) -> str:
        """``idx_key``, after checking ``output`` carries it."""
        if self.idx_key not in output:
            raise BadInputError(
                f"inference output has no {self.idx_key!r} (idx_key) key: keys {', '.join(map(str, output))}"
            )
        return self.idx_key

    @classmethod
    def forward(cls, idx: Any, dataset: Any = None, model: Any = None, **kwargs: Any) -> Any:
        """Call ``model`` on one item (``idx`` an int) or a batch (a list of ints) of ``dataset``.

        ``kwargs`` carry the provider env: ``input_key`` (required), ``inference_contract``
        (+ ``inference_contract_root``), ``idx_key``, ``model_kwargs`` and the legacy ``output_fn`` /
        ``output_fn_path``.
        """
        model_kwargs = kwargs.get("model_kwargs") or {}
        if not isinstance(model_kwargs, Mapping):
            raise ConfigError(f"model_kwargs: must be a mapping, got {type(model_kwargs).__name__}")
        if "input_key" not in kwargs:
            raise ConfigError("input_key: missing; name the dataset field(s) the model reads")
        input_key = kwargs["input_key"]
        contract = resolve_inference_contract(kwargs.get("inference_contract"), kwargs.get("inference_contract_root"))
        original = None
        if contract is not None:
            if kwargs.get("output_fn") or kwargs.get("output_fn_path"):
                raise ConfigError("output_fn: cannot be combined with an inference contract (contract:)")
            contract.validate_input_keys(input_key)
            dataset, original = prepare_inference_inputs(dataset, idx, contract, model)
        optional = {spec.name for spec in contract.inputs if spec.optional} if contract is not None else set()
        output_fn = kwargs.get("output_fn")
        if output_fn is None and kwargs.get("output_fn_path"):
            output_fn = load_callable(kwargs["output_fn_path"], "output_fn")
        batched = isinstance(idx, (list, tuple))
        indices = list(idx) if batched else [idx]
        samples = [dataset[i] for i in indices]
        inputs = cls._gather_inputs(samples, key_list(input_key), optional, batched, kwargs.get("idx_key", "utt_id"))
        inputs = cls.prepare_model_inputs(inputs)
        try:
            result = model(**inputs, **dict(model_kwargs))
        except Exception as exc:
            if not batched or not _is_out_of_memory(exc):
                raise
            raise RuntimeError(
                f"batched inference ran out of memory on {len(indices)} items (dataset indices {indices}); "
                f"lower batch_size, or sort the test set by length: {one_line(exc)}"
            ) from exc
        if output_fn is not None:
            result = output_fn(data=samples if batched else samples[0], model_output=result, idx=idx)
        result = cls.format_output(result, batched=batched)
        if contract is not None:
            result = validate_inference_outputs(result, idx, contract, model, original, kwargs.get("idx_key", "utt_id"))
        return result

    @staticmethod
    def _gather_inputs(samples: list, keys: list, optional: set, batched: bool, idx_key: str) -> dict:
        """``{key: value}`` (one item) or ``{key: [values]}`` (a batch) for every input key."""
        inputs = {}
        for key in keys:
            present = [isinstance(s, Mapping) and key in s for s in samples]
            if not all(present):
                if key in optional and not any(present):
                    continue
                missing = samples[present.index(False)]
                have = ", ".join(sorted(map(str, missing))) if isinstance(missing, Mapping) else type(missing).__name__
                mixed = " (optional inputs cannot be mixed within one batch)" if key in optional else ""
                raise BadInputError(f"dataset item has no input_key {key!r}{mixed} (it has: {have})")
            values = [s[key] for s in samples]
            inputs[key] = values if batched else values[0]
        return inputs

    @staticmethod
    def prepare_model_inputs(inputs):
        """Adapt the checked inputs to the backend's arguments; identity unless a system overrides it.

        >>> InferenceRunner.prepare_model_inputs({"text": "hi"})
        {'text': 'hi'}
        """
        return inputs

    @staticmethod
    def format_output(result, *, batched):
        """Turn raw model results into named outputs; identity unless a system overrides it.

        >>> InferenceRunner.format_output({"text": "hi"}, batched=False)
        {'text': 'hi'}
        """
        return result

    # -- writer hooks ----------------------------------------------------------------------------
    @staticmethod
    def open_writers(
        shard_dir: Path | None, output_artifacts: dict[str, dict] | None = None, **env: Any
    ) -> dict[str, Any]:
        return {
            "shard_dir": shard_dir,
            "artifact_configs": output_artifacts or {},
            "scp_handles": {},
            "field_keys": set(),
        }

    @staticmethod
    def write_record(
        writers: dict[str, Any],
        result: Any,
        state: dict[str, Any],
        idx_key: str = "utt_id",
        output_keys=None,
        hyp_key=None,
        ref_key=None,
        **env: Any,
    ) -> None:
        """Check each output and append ``<id> <value>`` to ``split.N/<field>.scp``."""
        wanted = output_keys if output_keys is not None else [*key_list(hyp_key), *key_list(ref_key)]
        shard_dir = Path(writers["shard_dir"])
        for output in _flatten(result):
            _check_output(output, idx_key, [*key_list(hyp_key), *key_list(ref_key)])
            fields = key_list(wanted) or [k for k in output if k != idx_key]
            writers["field_keys"].update(fields)
            utt = _utt_id(output[idx_key], idx_key)
            for field in fields:
                if field not in output:
                    raise BadInputError(f"{idx_key}={utt!r}: output has no field {field!r} listed in output_keys")
                value = materialize_output_value(
                    utt, field, output[field], shard_dir, writers["artifact_configs"].get(field)
                )
                handle = writers["scp_handles"].get(field)
                if handle is None:
                    handle = writers["scp_handles"][field] = (shard_dir / f"{field}.scp").open("w", encoding="utf-8")
                line = f"{utt} {_one_line_value(value, utt, field)}\n"
                try:
                    handle.write(line)
                except OSError as exc:
                    named(exc, handle.name)  # a failed write names no file (a full disk)
                    raise

    @staticmethod
    def close_writers(writers: dict[str, Any], state: dict[str, Any], **env: Any) -> dict[str, Any] | None:
        """Close the SCP files and list the fields written in ``field_keys.txt`` (sorted)."""
        failed = None
        for handle in writers.get("scp_handles", {}).values():
            try:  # every handle closed, even past a failing one; the first failure is reported
                handle.close()
            except OSError as exc:
                failed = failed or named(exc, handle.name)
        if failed is not None:
            raise failed
        keys = sorted(writers.get("field_keys", []))
        listing = Path(writers["shard_dir"]) / "field_keys.txt"
        try:
            listing.write_text("".join(f"{k}\n" for k in keys), encoding="utf-8")
        except OSError as exc:
            named(exc, listing)
            raise
        return None

    def merge(self, shard_dirs: list[Path]) -> None:
        """Concatenate each field's ``<field>.scp``, in shard order, into ``output_dir/[shard_subdir]``."""
        fields: list[str] = []
        for shard_dir in shard_dirs:
            keys = Path(shard_dir) / "field_keys.txt"
            if keys.exists():
                fields += [k for k in keys.read_text(encoding="utf-8").splitlines() if k not in fields]
        if not fields:
            raise BadInputError(f"{self.output_dir}: no output fields found in the shards (field_keys.txt)")
        ordered = sorted((Path(d) for d in shard_dirs), key=lambda p: int(p.name.split(".", 1)[1]))
        base = self.output_dir / self.shard_subdir if self.shard_subdir else self.output_dir
        for field in fields:
            parts = [d / f"{field}.scp" for d in ordered if (d / f"{field}.scp").exists()]
            target = base / f"{field}.scp"
            if parts:
                concat_files(parts, target)
            else:
                target.unlink(missing_ok=True)

    def __call__(self, indices: Iterable[int]) -> bool:
        """Run every shard, merge, and return True (the outputs are the SCP files on disk)."""
        super().__call__(indices)
        return True


def _check_output(output: Any, idx_key: str, required: list) -> None:
    if not isinstance(output, dict):
        raise BadInputError(
            f"forward() output must be a dict with {idx_key!r}, got {type(output).__name__}: "
            f"{one_line(repr(output))[:120]}"
        )
    if idx_key not in output:
        raise BadInputError(f"forward() output has no {idx_key!r} key (keys: {', '.join(map(str, output))})")
    missing = sorted(set(required) - set(output))
    if missing:
        raise BadInputError(
            f"{idx_key}={output[idx_key]!r}: output lacks required key(s) {', '.join(missing)} "
            f"(hyp_key/ref_key/output_keys)"
        )
    if isinstance(output[idx_key], (list, tuple)):
        raise BadInputError(
            f"forward() output {idx_key!r} must be a single value, not {type(output[idx_key]).__name__}"
        )


def _utt_id(value: Any, idx_key: str) -> str:
    try:
        return check_utt_id(value)
    except ValueError as exc:
        raise BadInputError(
            f"{idx_key} {value!r}: must be a plain token (no whitespace, '/' or '\\', "
            f"not '.' or '..'): it heads an SCP line and names artifact files"
        ) from exc


def _one_line_value(value: Any, utt: str, field: str) -> Any:
    if isinstance(value, str) and ("\n" in value or "\r" in value):
        raise BadInputError(f"utterance {utt!r}: field {field!r} contains a line break; SCP values must be one line")
    return value
