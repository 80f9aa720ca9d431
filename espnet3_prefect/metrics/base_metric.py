"""``BaseMetric``: ESPnet3 202611's metric base class without espnet3 (moved out of ``metrics.py``,
which re-exports it: a custom metric imports ``BaseMetric``/``Field`` from
:mod:`espnet3_prefect.metrics`).
"""

from __future__ import annotations

import abc
import copy
import functools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from espnet3_prefect.errors import BadInputError
from espnet3_prefect.metrics.metric_contract import Field, check_metric_batch, check_metric_contract  # noqa: F401 - Field: examples


class BaseMetric(abc.ABC):
    """ESPnet3 202611's ``BaseMetric`` for installations without espnet3 (same API and behaviour).

    Subclass it, declare ``inputs``/``outputs``, register counters with :meth:`add_state`, and
    implement :meth:`update` (one batch of rows: ``update(ref=[...], hyp=[...])``) and
    :meth:`compute` (the result from the states alone). :meth:`write_artifacts` may write files.

    >>> class Count(BaseMetric):
    ...     inputs = (Field("hyp", "text"),)
    ...     outputs = (Field("n", "number"),)
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.add_state("n", 0, "sum")
    ...     def update(self, *, hyp):
    ...         self.n += len(hyp)
    ...     def compute(self):
    ...         return {"n": self.n}
    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "hyp.scp"
    >>> _ = p.write_text("u1 a\\n\\nu2 b\\n")
    >>> Count()({"hyp": p}, "test")
    {'n': 2}
    """

    inputs: ClassVar[tuple[Any, ...]]
    outputs: ClassVar[tuple[Any, ...]]
    #: rows per :meth:`update` call inside :meth:`__call__`
    chunk_size: ClassVar[int] = 1000
    #: True only while :meth:`__call__` runs with an ``output_dir``: ``update`` may keep text for
    #: :meth:`write_artifacts` then, and only then.
    collect_artifacts: bool = False

    def __init__(self) -> None:
        check_metric_contract(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("update")
        if own is None or getattr(own, "__isabstractmethod__", False):
            return

        @functools.wraps(own)
        def update_checked(self, **values):
            check_metric_batch(self, values)
            return own(self, **values)

        cls.update = update_checked

    # states
    def add_state(self, name: str, default: Any, reduce: str) -> None:
        """Register ``self.<name>`` (a copy of ``default``), combined by ``reduce`` (``sum`` or ``cat``)."""
        specs = self.__dict__.setdefault("_state_specs", {})
        if name in specs or hasattr(self, name):
            raise ValueError(f"state {name!r} is already defined")
        if reduce == "sum":
            if isinstance(default, bool) or not isinstance(default, (int, float)):
                raise ValueError(f"state {name!r}: 'sum' needs an int or float default")
        elif reduce == "cat":
            if not isinstance(default, list):
                raise ValueError(f"state {name!r}: 'cat' needs a list default")
        else:
            raise ValueError(f"state {name!r}: reduce must be 'sum' or 'cat', got {reduce!r}")
        specs[name] = (copy.deepcopy(default), reduce)
        setattr(self, name, copy.deepcopy(default))

    def reset(self) -> None:
        """Every registered state back to a copy of its default."""
        for name, (default, _) in self.__dict__.get("_state_specs", {}).items():
            setattr(self, name, copy.deepcopy(default))

    def state(self) -> dict[str, Any]:
        """A deep copy of every registered state, by name."""
        return {name: copy.deepcopy(getattr(self, name)) for name in self.__dict__.get("_state_specs", {})}

    def merge_states(self, states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Combine per-rank :meth:`state` dicts: ``sum`` states added, ``cat`` states concatenated in order."""
        specs = self.__dict__.get("_state_specs", {})
        if not states:
            return {name: copy.deepcopy(default) for name, (default, _) in specs.items()}
        for one in states:
            self._check_state_names(one)
        return {
            name: (
                sum(one[name] for one in states)
                if reduce == "sum"
                else [x for one in states for x in copy.deepcopy(one[name])]
            )
            for name, (_, reduce) in specs.items()
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Set every registered state from ``state`` (exactly the registered names)."""
        self._check_state_names(state)
        for name in self.__dict__.get("_state_specs", {}):
            setattr(self, name, copy.deepcopy(state[name]))

    def _check_state_names(self, state: Mapping[str, Any]) -> None:
        names = set(self.__dict__.get("_state_specs", {}))
        if set(state) != names:
            raise ValueError(f"state names {sorted(state)} do not match the registered {sorted(names)}")

    @abc.abstractmethod
    def update(self, **values: Sequence[Any]) -> None:
        """Add one batch (one list per declared input name, equal lengths) to the states."""

    @abc.abstractmethod
    def compute(self) -> dict[str, float]:
        """The result (one number per declared output) from the states alone; no file is written."""

    def __call__(self, data: Mapping[str, Any], test_name: str, output_dir: Any = None) -> dict[str, float]:
        """Score one test set from its SCP files, ``chunk_size`` rows per :meth:`update`.

        With ``output_dir``, :meth:`write_artifacts` then gets ``output_dir / test_name``.
        """
        self.reset()
        self.collect_artifacts = output_dir is not None
        try:
            names = [f.name for f in self.inputs if f.name in data]
            if names:
                batch: dict[str, list[str]] = {n: [] for n in names}
                for _, row in self.iter_inputs(data, *names):
                    for n in names:
                        batch[n].append(row[n])
                    if len(batch[names[0]]) == self.chunk_size:
                        self.update(**batch)
                        batch = {n: [] for n in names}
                if batch[names[0]]:
                    self.update(**batch)
            result = self.compute()
            if output_dir is not None:
                test_dir = Path(output_dir) / test_name
                test_dir.mkdir(parents=True, exist_ok=True)
                self.write_artifacts(test_dir)
            return result
        finally:
            self.collect_artifacts = False

    def write_artifacts(self, test_dir: Path) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Write files for one test set after :meth:`compute` (only with an ``output_dir``); no-op here."""

    def iter_inputs(self, data: Mapping[str, Any], *keys: str) -> Iterator[tuple[str, dict[str, str]]]:
        """Yield ``(utt_id, {key: value})`` from several SCP files read in lockstep.

        Raises :class:`BadInputError` (one line, naming the files) when the files differ in
        length or in the utt_id of a row.
        """
        if not keys:
            raise ValueError("iter_inputs needs at least one SCP key")
        handles = {}
        try:
            for key in keys:
                handles[key] = open(data[key], encoding="utf-8")
            streams = {key: self._iter_scp_file(handle) for key, handle in handles.items()}
            row_number = 0
            while True:
                rows, ended = {}, []
                for key in keys:
                    try:
                        rows[key] = next(streams[key])
                    except StopIteration:
                        ended.append(key)
                if len(ended) == len(keys):
                    return
                row_number += 1
                if ended:
                    going = next(k for k in keys if k not in ended)
                    raise BadInputError(
                        f"{data[ended[0]]} ends after {row_number - 1} rows but {data[going]} goes on "
                        f"with {rows[going][0]!r}; inputs {', '.join(keys)} must list the same utt_ids"
                    )
                utt_id = rows[keys[0]][0]
                for key in keys[1:]:
                    if rows[key][0] != utt_id:
                        raise BadInputError(
                            f"{data[key]} row {row_number}: utt_id {rows[key][0]!r} where "
                            f"{data[keys[0]]} has {utt_id!r}; inputs {', '.join(keys)} must list "
                            "the same utt_ids in the same order"
                        )
                yield utt_id, {key: rows[key][1] for key in keys}
        finally:
            for handle in handles.values():
                handle.close()

    def _iter_scp_file(self, file_obj) -> Iterator[tuple[str, str]]:
        """``(utt_id, value)`` per non-blank line; the line and the value are stripped."""
        for line in file_obj:
            parts = line.strip().split(maxsplit=1)
            if parts:
                yield parts[0], (parts[1].strip() if len(parts) > 1 else "")
