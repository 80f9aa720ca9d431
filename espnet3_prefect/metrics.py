"""ESPnet3 202611's metric API, usable without espnet3: ``BaseMetric``, ``Field``, ``WER`` and ``CER``.

With espnet3 installed, ``espnet3.systems.esp2_asr.metrics.wer.WER`` (and ``...cer.CER``) are
ESPnet3's own classes and custom metrics subclass ESPnet3's ``BaseMetric``. Without it those two
``_target_`` paths resolve here (see :mod:`espnet3_prefect.targets`), and a custom metric written
against ESPnet3's ``BaseMetric`` runs unchanged when it imports ``BaseMetric``/``Field`` from here.

What a metric is, in both worlds:

* ``inputs`` / ``outputs``: tuples of :class:`Field`; every output has kind ``number``. The metrics
  config's ``inputs:`` binds each declared input to an SCP stem (``hyp: text`` reads
  ``<test>/text.scp``) or a test-set column (``ref: dataset:text``).
* ``metric(data, test_name, output_dir)``: ``data`` maps each bound name to the ``Path`` of an SCP
  file. The rows are read in lockstep (each line stripped, blank lines skipped, the utt_ids of all
  inputs equal row by row), ``chunk_size`` (1000) rows per ``update(**columns)`` call, then
  ``compute()`` gives the result and ``write_artifacts(output_dir / test_name)`` writes files.
* states registered with ``add_state`` are summed (``"sum"``) or concatenated (``"cat"``) across
  ranks by ``merge_states``; ``reset()`` restores them.

``WER``/``CER`` give exactly ESPnet3's numbers and files: each text is cleaned (``clean_types``),
stripped, and replaced by ``"."`` when nothing is left; each chunk goes to jiwer
(``process_words`` / ``process_characters``); the result is ``{"WER": round(100 * (S + D + I) /
(H + S + D), 2)}``; ``<test>/wer_alignment`` (``cer_alignment``) holds jiwer's
``visualize_alignment`` text of every chunk followed by one summary line. The alignment text is
spooled to a temporary file, not kept in memory.
"""

from __future__ import annotations

import abc
import copy
import functools
import numbers
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .atomic import atomic_open
from .errors import BadInputError, ConfigError, Espnet3PrefectError, MissingExtraError

#: ``dataset:<column>`` binds a metric input to a column of the test set itself.
DATASET_PREFIX = "dataset:"
#: The kinds a metric field may declare (ESPnet3's ``KINDS``).
METRIC_KINDS = ("audio", "number", "segments", "text")

try:  # one Field for the whole package once the contract library is there
    from .contract_standalone import Field  # type: ignore[attr-defined]
except ImportError:

    @dataclass(frozen=True)
    class Field:  # type: ignore[no-redef]
        """One declared input or output of a metric (ESPnet3's ``espnet3.contract.Field``).

        >>> Field("ref_text", "text").label
        'Ref text'
        """

        name: str
        kind: str
        label: str = ""
        optional: bool = False

        def __post_init__(self) -> None:
            if not isinstance(self.name, str) or not self.name.isidentifier():
                raise ConfigError(f"Field name {self.name!r} must be a Python identifier")
            if self.kind not in METRIC_KINDS:
                raise ConfigError(f"Field {self.name!r} has kind {self.kind!r}; known kinds: {', '.join(METRIC_KINDS)}")
            if not self.label:
                object.__setattr__(self, "label", self.name.replace("_", " ").capitalize())


class MetricContractError(Espnet3PrefectError, ValueError):
    """A metric's inputs, batch or result do not match what it declares (ESPnet3's error of that name)."""


class MetricDeclarationError(ConfigError, TypeError):
    """A metric's ``inputs``/``outputs`` declaration is missing or malformed (a ``TypeError`` upstream)."""


# -- the contract ----------------------------------------------------------------------------------


def class_path(metric: Any) -> str:
    """``<module>.<ClassName>`` of an instance: the key ESPnet3 files a metric's results under.

    >>> class Dummy: pass
    >>> class_path(Dummy())
    'espnet3_prefect.metrics.Dummy'
    """
    return f"{metric.__module__}.{type(metric).__name__}"


def check_metric_contract(metric: Any) -> None:
    """Raise :class:`MetricDeclarationError` unless ``inputs`` and ``outputs`` are well declared.

    Both are non-empty tuples of fields with distinct identifier names and known kinds; required
    inputs come before optional ones; outputs are never optional and all of kind ``number``.
    """
    name = type(metric).__qualname__
    if not (hasattr(metric, "inputs") or hasattr(metric, "outputs")):
        raise MetricDeclarationError(f"{name} declares no inputs/outputs; declare them as tuples of Field "
                                     "(class attributes, or on self before super().__init__())")
    for attr in ("inputs", "outputs"):
        fields = getattr(metric, attr, None)
        if not isinstance(fields, tuple) or not all(hasattr(f, "name") and hasattr(f, "kind") for f in fields):
            raise MetricDeclarationError(f"{name}.{attr} must be a tuple of Field")
        if not fields:
            raise MetricDeclarationError(f"{name}.{attr} must name at least one field")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise MetricDeclarationError(f"{name}.{attr} names a field twice: {names}")
        if any(f.kind not in METRIC_KINDS for f in fields):
            bad = next(f for f in fields if f.kind not in METRIC_KINDS)
            raise MetricDeclarationError(f"{name}.{attr} field {bad.name!r} has unknown kind {bad.kind!r}")
        optional = [bool(getattr(f, "optional", False)) for f in fields]
        if attr == "inputs" and optional != sorted(optional):
            raise MetricDeclarationError(f"{name}.inputs must list required fields before optional ones")
        if attr == "outputs" and any(optional):
            raise MetricDeclarationError(f"{name}.outputs cannot hold an optional field")
    for f in metric.outputs:
        if f.kind != "number":
            raise MetricDeclarationError(f"{name}.outputs field {f.name!r} must have kind 'number', not {f.kind!r}")


def check_metric_inputs(metric: Any, inputs: Any, where: str = "inputs") -> Optional[Dict[str, str]]:
    """The ``inputs:`` binding as ``{declared name: source}``; ``None`` when nothing is declared.

    ``inputs`` is a mapping name -> source, or a list of names that are their own sources. Every
    required input must be bound, no unknown name may be, and each source is a non-empty SCP
    stem or ``dataset:<column>``. Errors are one-line :class:`ConfigError` naming ``where``.
    """
    fields = getattr(metric, "inputs", None) or ()
    if not fields:
        return None
    if isinstance(fields, Mapping):  # ESPnet3 also reads {name: type} declarations
        declared = list(fields)
        required = [n for n, expected in fields.items() if not isinstance(None, expected)]
    else:
        declared = [f.name for f in fields]
        required = [f.name for f in fields if not getattr(f, "optional", False)]
    cls = type(metric).__name__
    if inputs is None:
        raise ConfigError(f"{where}: missing; {cls} declares inputs {', '.join(declared)}: bind each to an SCP "
                          f"stem or dataset:<column>, e.g. {{ref: dataset:text, hyp: text}}")
    if isinstance(inputs, Mapping):
        bindings = {str(k): v for k, v in inputs.items()}
    elif isinstance(inputs, (list, tuple)):
        bindings = {str(n): n for n in inputs}
    else:
        raise ConfigError(f"{where}: must map each declared input of {cls} to a source, got {inputs!r}")
    missing = [n for n in required if n not in bindings]
    unknown = [n for n in bindings if n not in declared]
    if missing or unknown:
        raise ConfigError(f"{where}: {cls} declares inputs {', '.join(declared)}; missing {missing}, unknown {unknown}")
    for name, source in bindings.items():
        if not isinstance(source, str) or not source or source == DATASET_PREFIX:
            raise ConfigError(f"{where}.{name}: {source!r} must be an SCP stem like 'text' or dataset:<column>")
    return bindings


def _is_number(value: Any) -> bool:
    try:
        import numpy as np

        if isinstance(value, np.bool_):
            return False
    except ImportError:  # pragma: no cover
        pass
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_metric_output(metric: Any, result: Mapping[str, Any]) -> None:
    """Raise :class:`MetricContractError` unless every declared output is in ``result`` as a real number."""
    outputs = getattr(metric, "outputs", None)
    if not outputs:
        return
    cls = type(metric).__name__
    names = [f.name for f in outputs]
    missing = [n for n in names if n not in result]
    if missing:
        raise MetricContractError(f"{cls} declares outputs {names} but returned {sorted(result)}; missing {missing}")
    for n in names:
        if not _is_number(result[n]):
            raise MetricContractError(f"{cls}.outputs field {n!r} must be number: returned as "
                                      f"{type(result[n]).__name__}, must be a real number")


def _accepts(kind: str, value: Any) -> bool:
    if kind == "text":
        return isinstance(value, str)
    if kind == "number":
        return _is_number(value)
    return True  # audio (a path, an array, ...) and segments: checked by the metric itself


def check_metric_batch(metric: Any, values: Mapping[str, Any]) -> None:
    """Raise :class:`MetricContractError` unless ``values`` is one good batch for ``metric.update``.

    No undeclared name; every required name present; each value a list or tuple; equal lengths;
    ``text`` elements are ``str`` and ``number`` elements real numbers.
    """
    cls = type(metric).__name__
    fields = {f.name: f for f in getattr(metric, "inputs", ())}
    declared = ", ".join(fields)
    for key in values:
        if key not in fields:
            raise MetricContractError(f"{cls} got input {key!r}; declared inputs: {declared}")
    given = {}
    for key, field in fields.items():
        value = values.get(key)
        if value is None:
            if getattr(field, "optional", False):
                continue
            raise MetricContractError(f"{cls} input {key!r} is missing; declared inputs: {declared}")
        if not isinstance(value, (list, tuple)):
            raise MetricContractError(f"{cls} input {key!r} must be a list or tuple, not {type(value).__name__}")
        given[key] = value
    if given:
        first, *rest = given
        for key in rest:
            if len(given[key]) != len(given[first]):
                raise MetricContractError(f"{cls} input {key!r} has {len(given[key])} items, "
                                          f"{first!r} has {len(given[first])}")
    for key, value in given.items():
        for i, elem in enumerate(value):
            if not _accepts(fields[key].kind, elem):
                raise MetricContractError(f"{cls} input {key!r}[{i}] is {type(elem).__name__}, "
                                          f"must be {fields[key].kind}")


# -- BaseMetric ------------------------------------------------------------------------------------


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

    inputs: ClassVar[Tuple[Any, ...]]
    outputs: ClassVar[Tuple[Any, ...]]
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

    def state(self) -> Dict[str, Any]:
        """A deep copy of every registered state, by name."""
        return {name: copy.deepcopy(getattr(self, name)) for name in self.__dict__.get("_state_specs", {})}

    def merge_states(self, states: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
        """Combine per-rank :meth:`state` dicts: ``sum`` states added, ``cat`` states concatenated in order."""
        specs = self.__dict__.get("_state_specs", {})
        if not states:
            return {name: copy.deepcopy(default) for name, (default, _) in specs.items()}
        for one in states:
            self._check_state_names(one)
        return {name: (sum(one[name] for one in states) if reduce == "sum"
                       else [x for one in states for x in copy.deepcopy(one[name])])
                for name, (_, reduce) in specs.items()}

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
    def compute(self) -> Dict[str, float]:
        """The result (one number per declared output) from the states alone; no file is written."""

    def __call__(self, data: Mapping[str, Any], test_name: str, output_dir: Any = None) -> Dict[str, float]:
        """Score one test set from its SCP files, ``chunk_size`` rows per :meth:`update`.

        With ``output_dir``, :meth:`write_artifacts` then gets ``output_dir / test_name``.
        """
        self.reset()
        self.collect_artifacts = output_dir is not None
        try:
            names = [f.name for f in self.inputs if f.name in data]
            if names:
                batch: Dict[str, List[str]] = {n: [] for n in names}
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

    def write_artifacts(self, test_dir: Path) -> None:
        """Write files for one test set after :meth:`compute` (only with an ``output_dir``); no-op here."""

    def iter_inputs(self, data: Mapping[str, Any], *keys: str) -> Iterator[Tuple[str, Dict[str, str]]]:
        """Yield ``(utt_id, {key: value})`` from several SCP files read in lockstep.

        Raises :class:`BadInputError` (one line, naming the files) when the files differ in
        length or in the utt_id of a row.
        """
        if not keys:
            raise ValueError("iter_inputs needs at least one SCP key")
        handles = {}
        try:
            for key in keys:
                handles[key] = open(data[key], "r", encoding="utf-8")
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
                    raise BadInputError(f"{data[ended[0]]} ends after {row_number - 1} rows but {data[going]} goes on "
                                        f"with {rows[going][0]!r}; inputs {', '.join(keys)} must list the same utt_ids")
                utt_id = rows[keys[0]][0]
                for key in keys[1:]:
                    if rows[key][0] != utt_id:
                        raise BadInputError(f"{data[key]} row {row_number}: utt_id {rows[key][0]!r} where "
                                            f"{data[keys[0]]} has {utt_id!r}; inputs {', '.join(keys)} must list "
                                            "the same utt_ids in the same order")
                yield utt_id, {key: rows[key][1] for key in keys}
        finally:
            for handle in handles.values():
                handle.close()

    def _iter_scp_file(self, file_obj) -> Iterator[Tuple[str, str]]:
        """``(utt_id, value)`` per non-blank line; the line and the value are stripped."""
        for line in file_obj:
            parts = line.strip().split(maxsplit=1)
            if parts:
                yield parts[0], (parts[1].strip() if len(parts) > 1 else "")


# -- text cleaning (espnet2's TextCleaner names) ----------------------------------------------------

_KOREAN_DIGITS = dict(zip("0123456789", "영일이삼사오육칠팔구"))
_KOREAN_LETTERS = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                           "에이 비 씨 디 이 에프 지 에이치 아이 제이 케이 엘 엠 엔 오 피 큐 알 에스 티 유 브이 더블유 엑스 와이 지".split()))
_ASCII_LOWER = re.compile("[a-z]+")


def _korean_cleaner(text: str) -> str:
    """espnet2's ``korean_cleaner``: strip, digits and Latin letters spelled out in Hangul."""
    text = "".join(_KOREAN_DIGITS.get(c, c) for c in text.strip())
    text = _ASCII_LOWER.sub(lambda m: m.group().upper(), text)
    return "".join(_KOREAN_LETTERS.get(c, c) for c in text)


def _optional_cleaner(name: str) -> Callable[[str], str] | str:
    """The third-party function espnet2 uses for ``name``, or why it is not available."""
    try:
        if name == "tacotron":
            import tacotron_cleaner.cleaners as cleaners

            return cleaners.custom_english_cleaners
        if name == "jaconv":
            from jaconv import jaconv

            return jaconv.normalize
        if name == "vietnamese":
            from vietnamese_cleaner import vietnamese_cleaners

            return vietnamese_cleaners.vietnamese_cleaner
    except ImportError:
        package = {"tacotron": "tacotron-cleaner", "jaconv": "jaconv", "vietnamese": "underthesea"}[name]
        return f"needs the {package} package"
    return "is not a cleaner type"


class TextCleaner:
    """espnet2's ``TextCleaner(cleaner_types)``: apply each named cleaner in order.

    With espnet2 importable, espnet2's own class does the work. Without it: ``korean_cleaner``;
    ``tacotron``, ``jaconv`` and ``vietnamese`` when their packages are installed; ``whisper_en``
    / ``whisper_basic`` (and any other name holding ``whisper``, which applies the last of those
    two) when openai-whisper is. Any other name is a :class:`ConfigError` at construction.

    >>> TextCleaner(["korean_cleaner"])(" abc 12 ")
    '에이비씨 일이'
    >>> TextCleaner(None)("Kept As Is ")
    'Kept As Is '
    """

    def __init__(self, cleaner_types: Any = None):
        self.cleaner_types = self.names(cleaner_types)
        self._espnet = None
        self._steps: list[Callable[[str], str]] = []
        if not self.cleaner_types:
            return
        espnet_cls = _espnet2_cleaner()
        if espnet_cls is not None:  # pragma: no cover - espnet2 is not in our own venv
            self._espnet = espnet_cls(self.cleaner_types)
            return
        self._steps = self.plan(self.cleaner_types)

    @staticmethod
    def names(cleaner_types: Any) -> list[str]:
        if cleaner_types is None:
            return []
        names = [cleaner_types] if isinstance(cleaner_types, str) else list(cleaner_types)
        for name in names:
            if not isinstance(name, str):
                raise ConfigError(f"clean_types: {name!r} is not a cleaner name")
        return names

    @staticmethod
    def plan(names: Sequence[str]) -> list[Callable[[str], str]]:
        """The cleaning steps for ``names``; a one-line :class:`ConfigError` for one we cannot run."""
        whisper = None
        if any("whisper" in n for n in names):
            try:
                from whisper.normalizers import BasicTextNormalizer, EnglishTextNormalizer
            except (ImportError, SyntaxError):
                bad = next(n for n in names if "whisper" in n)
                raise ConfigError(f"clean_types: {bad!r} needs the openai-whisper package (or espnet2)") from None
            for n in names:
                if n == "whisper_en":
                    whisper = EnglishTextNormalizer()
                elif n == "whisper_basic":
                    whisper = BasicTextNormalizer()
        steps: list[Callable[[str], str]] = []
        for n in names:
            if n == "korean_cleaner":
                steps.append(_korean_cleaner)
            elif "whisper" in n and whisper is not None:
                steps.append(whisper)
            elif n in ("tacotron", "jaconv", "vietnamese"):
                step = _optional_cleaner(n)
                if isinstance(step, str):
                    raise ConfigError(f"clean_types: {n!r} {step} (or espnet2)")
                steps.append(step)
            else:
                raise ConfigError(f"clean_types: {n!r} is not supported; espnet2's TextCleaner knows tacotron, "
                                  "jaconv, vietnamese, korean_cleaner, whisper_en, whisper_basic")
        return steps

    def __call__(self, text: str) -> str:
        if self._espnet is not None:  # pragma: no cover
            return self._espnet(text)
        for step in self._steps:
            text = step(text)
        return text


def _espnet2_cleaner():
    try:
        from espnet2.text.cleaner import TextCleaner as EspnetCleaner
    except ImportError:
        return None
    return EspnetCleaner  # pragma: no cover


# -- WER / CER -------------------------------------------------------------------------------------


def _jiwer():
    try:
        import jiwer
    except ImportError:
        raise MissingExtraError('WER/CER need jiwer: pip install "espnet3-prefect[metrics]"') from None
    return jiwer


class _ErrorRate(BaseMetric):
    """Counts of jiwer's alignment, summed over chunks; the rate in percent, 2 decimals."""

    inputs = (Field("ref", "text"), Field("hyp", "text"))
    #: the result key, also the alignment file's prefix
    result_key: ClassVar[str] = ""
    unit: ClassVar[str] = ""

    def __init__(self, clean_types: Any = None) -> None:
        self.cleaner = TextCleaner(clean_types)
        super().__init__()
        for name in ("hits", "substitutions", "deletions", "insertions"):
            self.add_state(name, 0, "sum")
        self._spool = None

    @classmethod
    def check_clean_types(cls, clean_types: Any) -> None:
        """Fail at config time (one line) for a cleaner this installation cannot run."""
        names = TextCleaner.names(clean_types)
        if names and _espnet2_cleaner() is None:
            TextCleaner.plan(names)

    def reset(self) -> None:
        super().reset()
        self._close_spool()

    def _close_spool(self) -> None:
        spool, self._spool = getattr(self, "_spool", None), None
        if spool is not None:
            spool.close()

    def _clean(self, text: str) -> str:
        cleaned = self.cleaner(text).strip()
        return cleaned or "."  # jiwer refuses an empty sentence

    def _align(self, refs: list[str], hyps: list[str]):
        raise NotImplementedError

    def update(self, *, ref: Sequence[str], hyp: Sequence[str]) -> None:
        jiwer = _jiwer()
        if not ref:
            return
        out = self._align([self._clean(r) for r in ref], [self._clean(h) for h in hyp])
        self.hits += out.hits
        self.substitutions += out.substitutions
        self.deletions += out.deletions
        self.insertions += out.insertions
        if self.collect_artifacts:
            if self._spool is None:
                self._spool = tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+", encoding="utf-8")
            self._spool.write(jiwer.visualize_alignment(out, show_measures=False))

    def compute(self) -> Dict[str, float]:
        n = self.hits + self.substitutions + self.deletions
        if n == 0:
            raise BadInputError(f"nothing to score: the references have no {self.unit}")
        errors = self.substitutions + self.deletions + self.insertions
        return {self.result_key: round(100 * errors / n, 2)}

    def write_artifacts(self, test_dir: Path) -> None:
        """``<test_dir>/<result_key>_alignment``: every chunk's alignment text, then a summary line."""
        n = self.hits + self.substitutions + self.deletions
        rate = 100 * (self.substitutions + self.deletions + self.insertions) / n if n else 0.0
        with atomic_open(Path(test_dir) / f"{self.result_key.lower()}_alignment") as out:
            if self._spool is not None:
                self._spool.seek(0)
                shutil.copyfileobj(self._spool, out)
            out.write(f"\n{self.result_key}: {rate:.2f} (hits={self.hits}, substitutions={self.substitutions}, "
                      f"deletions={self.deletions}, insertions={self.insertions})\n")
        self._close_spool()

    def __deepcopy__(self, memo):
        clone = copy.copy(self)
        clone.__dict__ = {k: (None if k == "_spool" else copy.deepcopy(v, memo)) for k, v in self.__dict__.items()}
        return clone


class WER(_ErrorRate):
    """Word error rate: ESPnet3's ``espnet3.systems.esp2_asr.metrics.wer.WER`` without espnet3.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> _ = (d / "ref.scp").write_text("u1 a b c d\\n"); _ = (d / "hyp.scp").write_text("u1 a x c\\n")
    >>> WER()({"ref": d / "ref.scp", "hyp": d / "hyp.scp"}, "test", d)
    {'WER': 50.0}
    >>> (d / "test" / "wer_alignment").read_text().splitlines()[-1]
    'WER: 50.00 (hits=2, substitutions=1, deletions=1, insertions=0)'
    """

    outputs = (Field("WER", "number"),)
    result_key = "WER"
    unit = "words"

    def _align(self, refs, hyps):
        return _jiwer().process_words(refs, hyps)


class CER(_ErrorRate):
    """Character error rate: ESPnet3's ``espnet3.systems.esp2_asr.metrics.cer.CER`` without espnet3.

    Inner spaces are characters (jiwer's ``process_characters``).
    """

    outputs = (Field("CER", "number"),)
    result_key = "CER"
    unit = "characters"

    def _align(self, refs, hyps):
        return _jiwer().process_characters(refs, hyps)


__all__ = ["BaseMetric", "CER", "DATASET_PREFIX", "Field", "MetricContractError", "MetricDeclarationError",
           "TextCleaner", "WER", "check_metric_batch", "check_metric_contract", "check_metric_inputs",
           "check_metric_output", "class_path"]
