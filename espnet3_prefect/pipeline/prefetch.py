"""Prefetch: read the items of the next batches in a background thread while ``forward`` runs.

The shard loop calls the runner's ``forward(idx, dataset=..., **env)``, and ``forward`` reads
``dataset[i]`` itself. To overlap that reading with the model, ``forward`` gets a *view* of the
dataset instead of the dataset: an instance of a subclass of the dataset's own class, named like
it, sharing the dataset's attribute dict (``type(view).__name__``, ``isinstance``, attributes and
methods are the dataset's). Its ``__getitem__`` serves ``dataset[i]`` as read ahead by one
background thread, and reads the dataset in place for anything else. Every value ``forward`` gets
is what ``dataset[i]`` returns, in the order it asks:

- each read-ahead value is handed out once: a second ``dataset[i]`` in the same call (or an index
  that was not read ahead, a slice, a key) reads the dataset again, as it would without prefetch;
- the thread reads units (batches) strictly in order, at most ``depth`` units ahead (a bounded
  queue), one item at a time; the dataset is never called from two threads at once (one lock);
- a read that fails in the thread is read again, once, in the shard loop's thread when ``forward``
  asks for it: the error ``forward`` sees (and the shard loop's message naming the utterance) is
  the one an unprefetched read raises. If the second read succeeds (a dataset tied to one thread),
  prefetch is turned off for the rest of the shard and a warning says so.

Only datasets whose class can be subclassed this way get a view (a plain Python class with an
instance dict, ``type`` or ``ABCMeta`` as metaclass, a ``__getitem__``); others (a list, a numpy
array, a class with ``__slots__``) are passed through untouched and read inside ``forward`` as before.
``runner.prefetch: 0`` turns it off (the dataset is then never wrapped).
"""

from __future__ import annotations

import abc
import numbers
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

#: units after which a shard that waited longer than its reads took reads in place (:meth:`Prefetcher.advance`)
WORTH_IT_AFTER_UNITS = 16

_ACTIVE: dict[int, Prefetcher] = {}  # id(view) -> its prefetcher, while its shard runs
_VIEW_TYPES: dict[type, type | None] = {}
_VIEW_TYPES_LOCK = threading.Lock()


class Timing:
    """Where a shard's time goes, measured with ``perf_counter`` around the loop's own calls.

    ``load_s``: reading items (``dataset[i]``, in the prefetch thread or in place; None when the
    dataset could not be observed, i.e. prefetch off or a dataset without a view: loading is then
    inside ``forward_s``); ``wait_s``: the shard loop waiting for items (read in place, or not yet
    read ahead); ``forward_s``: inside ``forward`` minus that waiting; ``write_s``: the writer/state
    hooks, the failures file and the done marker; ``prefetch``: the depth used (0: off).
    """

    __slots__ = ("load_s", "wait_s", "forward_s", "write_s", "prefetch")

    def __init__(self) -> None:
        self.load_s: float | None = None
        self.wait_s = self.forward_s = self.write_s = 0.0
        self.prefetch = 0

    def to_dict(self) -> dict:
        return {
            "load_s": None if self.load_s is None else round(self.load_s, 4),
            "wait_s": round(self.wait_s, 4),
            "forward_s": round(self.forward_s, 4),
            "write_s": round(self.write_s, 4),
            "prefetch": self.prefetch,
        }


def view_type(cls: type) -> type | None:
    """The view class for datasets of class ``cls`` (cached), or None when ``cls`` cannot have one."""
    with _VIEW_TYPES_LOCK:
        if cls not in _VIEW_TYPES:
            _VIEW_TYPES[cls] = _make_view_type(cls)
        return _VIEW_TYPES[cls]


def _make_view_type(cls: type) -> type | None:
    if type(cls) not in (type, abc.ABCMeta) or cls.__module__ == "builtins":
        return None  # a metaclass of its own may register or check subclasses: leave it alone
    if not callable(getattr(cls, "__getitem__", None)):
        return None
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        slots = (slots,) if isinstance(slots, str) else tuple(slots)
        if any(name not in ("__dict__", "__weakref__") for name in slots):
            return None  # slot values would not be shared with the dataset

    def __getitem__(self, key):
        prefetcher = _ACTIVE.get(id(self))
        if prefetcher is None:  # kept beyond its shard: behave exactly as the dataset
            return cls.__getitem__(self, key)
        return prefetcher.get(key)

    namespace = {
        "__getitem__": __getitem__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "_e3p_prefetch_view": True,
    }
    try:
        return type(cls)(cls.__name__, (cls,), namespace)
    except Exception:  # noqa: BLE001 - a class that refuses subclasses is read without prefetch
        return None


def make_view(dataset: Any) -> Any:
    """A view sharing ``dataset``'s attributes (see the module doc), or None when it cannot have one."""
    cls = view_type(type(dataset))
    if cls is None:
        return None
    try:
        attributes = object.__getattribute__(dataset, "__dict__")
        view = object.__new__(cls)
        view.__dict__ = attributes
    except Exception:  # noqa: BLE001 - C-level layouts, no instance dict: no view
        return None
    return view


def _as_index(key: Any) -> int | None:
    if isinstance(key, bool) or not isinstance(key, numbers.Integral):
        return None
    return int(key)


def _indices(unit: Any) -> Iterable[int]:
    return unit if isinstance(unit, list) else [unit]


class Prefetcher:
    """Reads ``dataset[i]`` for the shard's units, in order, up to ``depth`` units ahead.

    The shard loop calls :meth:`advance` before each unit's ``forward`` (units in order, each once)
    and :meth:`close` at the end, also after an error. ``view`` is what ``forward`` gets as ``dataset``.
    """

    def __init__(self, dataset: Any, units: list, depth: int, view: Any, warn: Callable[[str], Any] | None = None):
        self.dataset, self.units, self.depth, self.view = dataset, units, depth, view
        self.warn = warn
        self._lock = threading.Lock()  # one dataset read at a time, whichever thread
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._buffer: dict[int, list] = {}
        self._off = depth <= 0
        self.thread_load_s = 0.0  # written by the thread only
        self.inline_load_s = self.inline_wait_s = self.wait_s = 0.0  # written by the shard loop only
        self._thread = None
        _ACTIVE[id(view)] = self
        if not self._off:
            self._thread = threading.Thread(target=self._read_ahead, name="e3p-prefetch", daemon=True)
            self._thread.start()

    # -- the background thread --------------------------------------------------------------------
    def _read_ahead(self) -> None:
        try:
            for position, unit in enumerate(self.units):
                fetched: dict[int, list] = {}
                for index in _indices(unit):
                    if self._stop.is_set():
                        return
                    with self._lock:
                        started = time.perf_counter()
                        try:
                            entry = (True, self.dataset[index])
                        except Exception as exc:  # noqa: BLE001 - read again in place, see get()
                            entry = (False, exc)
                        self.thread_load_s += time.perf_counter() - started
                    fetched.setdefault(index, []).append(entry)
                if not self._put((position, fetched)):
                    return
        except BaseException as exc:  # noqa: BLE001 - never die silently: the loop reads in place instead
            self._put((-1, exc))

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    # -- the shard loop's thread ------------------------------------------------------------------
    def advance(self, position: int) -> None:
        """Make unit ``position``'s read-ahead items the ones ``forward`` is served next.

        From unit :data:`WORTH_IT_AFTER_UNITS` on, when the loop has waited longer for read-ahead items
        than the thread took to read them, the rest of the shard is read in place, quietly: a forward
        holding the GIL (pure Python) makes each hand-over wait for the interpreter's switch interval
        (0.06 s of reads, 0.6 s of waiting over 10,000 items). Values and order are the same."""
        self._buffer = {}
        if self._off:
            return
        started = time.perf_counter()
        try:
            while True:
                got, fetched = self._queue.get()
                if got == position:
                    self._buffer = fetched
                    break
                if got == -1:
                    self._turn_off(f"its thread stopped ({type(fetched).__name__}: {fetched})")
                    return
                if got > position:  # units must be asked for in order, each once
                    self._turn_off(f"unit {position} was asked for after unit {got}")
                    return
        finally:
            self.wait_s += time.perf_counter() - started
        if position >= WORTH_IT_AFTER_UNITS and self.wait_s > self.thread_load_s:
            self._turn_off("", quietly=True)

    def get(self, key: Any) -> Any:
        """``dataset[key]``: the read-ahead value when there is one left for ``key``, else read now."""
        index = _as_index(key)
        entries = self._buffer.get(index) if index is not None else None
        if entries:
            ok, value = entries.pop(0)
            if ok:
                return value
            again = self.read_in_place(key)  # raises what an unprefetched read raises
            self._turn_off(
                f"dataset[{key!r}] failed in the prefetch thread ({type(value).__name__}: {value}) "
                f"but not when read again in the shard's own thread"
            )
            return again
        return self.read_in_place(key)

    def read_in_place(self, key: Any) -> Any:
        """``dataset[key]`` now, in this thread, timed (never while the thread reads)."""
        asked = time.perf_counter()
        with self._lock:
            started = time.perf_counter()
            try:
                return self.dataset[key]
            finally:
                done = time.perf_counter()
                self.inline_load_s += done - started
                self.inline_wait_s += done - asked

    def peek(self, key: Any) -> Any:
        """``dataset[key]`` for an error message (untimed, serialized with the thread's reads)."""
        with self._lock:
            return self.dataset[key]

    def _turn_off(self, why: str, quietly: bool = False) -> None:
        if self._off:
            return
        self._off = True
        self._stop.set()
        if self.warn and not quietly:
            self.warn(
                f"prefetch turned off for the rest of this shard: {why}; set runner.prefetch: 0 "
                f"if the dataset must be read from one thread"
            )

    def close(self) -> None:
        """Stop the thread and wait for it (at most the read it is in); forget the view."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    while True:
                        self._queue.get_nowait()
                except queue.Empty:
                    pass
                self._thread.join(timeout=0.05)
        self._buffer = {}
        _ACTIVE.pop(id(self.view), None)

    @property
    def load_s(self) -> float:
        return self.thread_load_s + self.inline_load_s

    @property
    def stall_s(self) -> float:
        """Time the shard loop spent on data: waiting for read-ahead units and reading in place."""
        return self.wait_s + self.inline_wait_s
