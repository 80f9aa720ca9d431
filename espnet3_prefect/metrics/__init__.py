"""ESPnet3 202611's metric API, usable without espnet3: ``BaseMetric``, ``Field``, ``WER`` and ``CER``.

With espnet3 installed, ``espnet3.systems.esp2_asr.metrics.wer.WER`` (and ``...cer.CER``) are
ESPnet3's own classes and custom metrics subclass ESPnet3's ``BaseMetric``. Without it those two
``_target_`` paths resolve here (see :mod:`espnet3_prefect.config.targets`), and a custom metric written
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

``WER``/``CER`` (whose class path is their results' key) and :func:`class_path` live here;
``BaseMetric`` in :mod:`~espnet3_prefect.metrics.base_metric`, the declaration and batch checks in
:mod:`~espnet3_prefect.metrics.metric_contract`, ``TextCleaner`` in :mod:`~espnet3_prefect.metrics.text_cleaner`,
all re-exported here.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from espnet3_prefect._internal.atomic import atomic_open
from espnet3_prefect.errors import BadInputError, MissingExtraError
from espnet3_prefect.metrics.base_metric import BaseMetric
from espnet3_prefect.metrics.metric_contract import (
    DATASET_PREFIX,
    Field,
    MetricContractError,
    MetricDeclarationError,
    check_metric_batch,
    check_metric_contract,
    check_metric_inputs,
    check_metric_output,
)
from espnet3_prefect.metrics.text_cleaner import TextCleaner, espnet2_cleaner


def class_path(metric: Any) -> str:
    """``<module>.<ClassName>`` of an instance: the key ESPnet3 files a metric's results under.

    >>> class Dummy: pass
    >>> class_path(Dummy())
    'espnet3_prefect.metrics.Dummy'
    """
    return f"{metric.__module__}.{type(metric).__name__}"


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
        if names and espnet2_cleaner() is None:
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

    def compute(self) -> dict[str, float]:
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
            out.write(
                f"\n{self.result_key}: {rate:.2f} (hits={self.hits}, substitutions={self.substitutions}, "
                f"deletions={self.deletions}, insertions={self.insertions})\n"
            )
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


__all__ = [
    "BaseMetric",
    "CER",
    "DATASET_PREFIX",
    "Field",
    "MetricContractError",
    "MetricDeclarationError",
    "TextCleaner",
    "WER",
    "check_metric_batch",
    "check_metric_contract",
    "check_metric_inputs",
    "check_metric_output",
    "class_path",
]
