"""Built-in metrics: WER and CER with jiwer, streamed over SCP files, in percent with 2 decimals.

A metric is any callable ``metric(data, test_name, inference_dir) -> dict`` (ESPnet3's contract):
``data`` maps each input alias to an :class:`~espnet3_prefect.scp.ScpField` (a path to
``<inference_dir>/<test_name>/<name>.scp`` that also iterates like a list of values). ESPnet3's
stock ``_target_`` paths (``espnet3.systems.asr.metrics.wer.WER``, ``...cer.CER``) resolve here
when espnet3 is not installed.
"""

from __future__ import annotations

import re
import string
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from .atomic import atomic_open
from .errors import ConfigError, MissingExtraError
from .scp import aligned_values, chunked
from .util import is_int

# -- text cleaning ---------------------------------------------------------------------------------

_BRACKETS = re.compile(r"[<\[][^>\]]*[>\]]|\([^)]*\)")


def _remove_punctuation(text: str) -> str:
    return "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)


def _whisper_basic(text: str) -> str:
    """Close to Whisper's basic normalizer: lowercase, drop bracketed spans, punctuation/symbols -> space."""
    text = _BRACKETS.sub(" ", text.lower())
    text = unicodedata.normalize("NFKC", text)
    return _remove_punctuation(text)


BUILTIN_CLEANERS: dict[str, Callable[[str], str]] = {
    "lowercase": str.lower,
    "uppercase": str.upper,
    "remove_punctuation": _remove_punctuation,
    "ascii_punctuation": lambda t: t.translate(str.maketrans({c: " " for c in string.punctuation})),
    "nfkc": lambda t: unicodedata.normalize("NFKC", t),
    "whisper_basic": _whisper_basic,
}


class TextCleaner:
    """Apply ``clean_types`` in order, then collapse whitespace.

    With espnet2 installed its ``TextCleaner`` is used (ESPnet's reference behaviour); without it
    the built-in cleaners above are available. Unknown names fail at config time.

    >>> TextCleaner(["lowercase", "remove_punctuation"])("Hello,  World!")
    'hello world'
    """

    def __init__(self, clean_types: str | Sequence[str] | None = None):
        names = [clean_types] if isinstance(clean_types, str) else list(clean_types or [])
        self.names = names
        self._espnet = None
        self._steps: list[Callable[[str], str]] = []
        if not names:
            return
        try:  # pragma: no cover - espnet2 is not installed in our CI
            from espnet2.text.cleaner import TextCleaner as EspnetCleaner

            self._espnet = EspnetCleaner(names)
            return
        except ImportError:
            pass
        unknown = [n for n in names if n not in BUILTIN_CLEANERS]
        if unknown:
            raise ConfigError(f"clean_types: unknown cleaner {unknown[0]!r}; valid values without espnet2: "
                              f"{', '.join(BUILTIN_CLEANERS)}")
        self._steps = [BUILTIN_CLEANERS[n] for n in names]

    def __call__(self, text: str) -> str:
        if self._espnet is not None:  # pragma: no cover
            text = self._espnet(text)
        for step in self._steps:
            text = step(text)
        return " ".join(text.split())


# -- metrics ---------------------------------------------------------------------------------------


class Metric:
    """Base for metrics: implement ``__call__(data, test_name, inference_dir) -> dict``.

    Subclassing is optional; any callable with that signature works as a ``_target_``.
    """

    def __call__(self, data: Mapping[str, Any], test_name: str, inference_dir: Path) -> dict:
        raise NotImplementedError


def _jiwer():
    try:
        import jiwer
    except ImportError:
        raise MissingExtraError('WER/CER need jiwer: pip install "espnet3-prefect[metrics]"') from None
    return jiwer


class ErrorRate(Metric):
    """Edit-distance error rate over tokens (words or characters), accumulated corpus-wide.

    Counts are summed utterance by utterance (``chunk_size`` utterances go to jiwer at a time), so
    memory does not grow with the test set. The score is ``100 * (S + D + I) / N`` rounded to 2
    decimals, where ``N`` is the number of reference tokens; an empty hypothesis counts every
    reference token as a deletion. Writes ``<inference_dir>/<test>/<name>_alignment.txt``.
    """

    name = "ER"
    unit = "token"

    def __init__(self, ref_key: str = "ref", hyp_key: str = "hyp", clean_types: str | Sequence[str] | None = None,
                 chunk_size: int = 1000, alignment: bool = True):
        if not isinstance(ref_key, str) or not isinstance(hyp_key, str) or not ref_key or not hyp_key:
            raise ConfigError(f"{self.name}: ref_key and hyp_key must be non-empty strings, got {ref_key!r}, {hyp_key!r}")
        if not is_int(chunk_size) or chunk_size < 1:
            raise ConfigError(f"{self.name}: chunk_size must be a positive integer, got {chunk_size!r}")
        self.ref_key, self.hyp_key = ref_key, hyp_key
        self.clean_types = clean_types
        self.cleaner = TextCleaner(clean_types)
        self.chunk_size = chunk_size
        self.alignment = alignment

    # tokens as jiwer sees them: words split on whitespace, or characters of the single-spaced text
    def tokens(self, text: str) -> list[str]:
        raise NotImplementedError

    def _process(self, refs: list[str], hyps: list[str]):
        raise NotImplementedError

    def alignment_path(self, test_name: str, inference_dir: Path) -> Path:
        return Path(inference_dir) / test_name / f"{self.name.lower()}_alignment.txt"

    def __call__(self, data: Mapping[str, Any], test_name: str, inference_dir: Path) -> dict:
        counts = {"sub": 0, "del": 0, "ins": 0, "hit": 0, "utts": 0}
        rows = aligned_values(data, [self.ref_key, self.hyp_key])
        out_path = self.alignment_path(test_name, inference_dir)
        if self.alignment:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(out_path) as out:
                out.write(f"# {self.name} alignment of {test_name}: ref={self.ref_key} hyp={self.hyp_key}; "
                          f"S substitution, D deletion, I insertion\n")
                self._score(rows, counts, out)
        else:
            self._score(rows, counts, None)
        return self.result(counts)

    def result(self, counts: dict) -> dict:
        n = self.name
        errors = counts["sub"] + counts["del"] + counts["ins"]
        ref_len = counts["sub"] + counts["del"] + counts["hit"]
        score = round(100.0 * errors / ref_len, 2) if ref_len else (0.0 if errors == 0 else None)
        return {n: score, f"{n}_errors": errors, f"{n}_ref_len": ref_len, f"{n}_sub": counts["sub"],
                f"{n}_del": counts["del"], f"{n}_ins": counts["ins"], f"{n}_hit": counts["hit"]}

    def _score(self, rows: Iterable[tuple[str, list[str]]], counts: dict, out) -> None:
        for chunk in chunked(rows, self.chunk_size):
            utts = [utt for utt, _ in chunk]
            refs = [self.tokens(self.cleaner(ref)) for _, (ref, _) in chunk]
            hyps = [self.tokens(self.cleaner(hyp)) for _, (_, hyp) in chunk]
            both = [i for i in range(len(chunk)) if refs[i] and hyps[i]]
            aligned = {}
            if both:  # jiwer for pairs with tokens on both sides; empty sides counted here
                output = self._process([self._join(refs[i]) for i in both], [self._join(hyps[i]) for i in both])
                aligned = dict(zip(both, output.alignments))
            for i, utt in enumerate(utts):
                ops = aligned.get(i)
                if ops is None:
                    ops = [("delete", 0, len(refs[i]), 0, 0)] if refs[i] else []
                    ops += [("insert", 0, 0, 0, len(hyps[i]))] if hyps[i] else []
                else:
                    ops = [(c.type, c.ref_start_idx, c.ref_end_idx, c.hyp_start_idx, c.hyp_end_idx) for c in ops]
                c = _tally(ops, counts)
                counts["utts"] += 1
                if out is not None:
                    out.write(_format_alignment(utt, refs[i], hyps[i], ops, c, self.unit))

    def _join(self, tokens: list[str]) -> str:
        raise NotImplementedError


class WER(ErrorRate):
    """Word error rate in percent (jiwer ``process_words``). ESPnet3: ``espnet3.systems.asr.metrics.wer.WER``.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); (d / "t").mkdir()
    >>> _ = (d / "t/ref.scp").write_text("u1 a b c d\\n"); _ = (d / "t/hyp.scp").write_text("u1 a x c\\n")
    >>> WER()({"ref": d / "t/ref.scp", "hyp": d / "t/hyp.scp"}, "t", d)["WER"]
    50.0
    """

    name = "WER"
    unit = "word"

    def tokens(self, text: str) -> list[str]:
        return text.split()

    def _join(self, tokens: list[str]) -> str:
        return " ".join(tokens)

    def _process(self, refs, hyps):
        return _jiwer().process_words(refs, hyps)


class CER(ErrorRate):
    """Character error rate in percent (jiwer ``process_characters``; inner spaces count as characters).

    ESPnet3: ``espnet3.systems.asr.metrics.cer.CER``.
    """

    name = "CER"
    unit = "char"

    def tokens(self, text: str) -> list[str]:
        return list(" ".join(text.split()))

    def _join(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def _process(self, refs, hyps):
        return _jiwer().process_characters(refs, hyps)


def _tally(ops: list[tuple], counts: dict) -> dict:
    c = {"S": 0, "D": 0, "I": 0, "C": 0}
    for kind, r0, r1, h0, h1 in ops:
        if kind == "equal":
            c["C"] += r1 - r0
        elif kind == "substitute":
            c["S"] += r1 - r0
        elif kind == "delete":
            c["D"] += r1 - r0
        elif kind == "insert":
            c["I"] += h1 - h0
    counts["hit"] += c["C"]
    counts["sub"] += c["S"]
    counts["del"] += c["D"]
    counts["ins"] += c["I"]
    return c


def _format_alignment(utt: str, ref: list[str], hyp: list[str], ops: list[tuple], c: dict, unit: str) -> str:
    """Three aligned rows (REF, HYP, marks) per utterance; ``*`` fills the missing side."""
    r_row, h_row, m_row = [], [], []

    def cell(r: str, h: str, mark: str) -> None:
        width = max(len(r), len(h), 1)
        r_row.append(r.ljust(width))
        h_row.append(h.ljust(width))
        m_row.append(mark.ljust(width))

    for kind, r0, r1, h0, h1 in ops:
        if kind == "equal":
            for r in ref[r0:r1]:
                cell(_show(r), _show(r), " ")
        elif kind == "substitute":
            for r, h in zip(ref[r0:r1], hyp[h0:h1]):
                cell(_show(r), _show(h), "S")
        elif kind == "delete":
            for r in ref[r0:r1]:
                cell(_show(r), "*" * len(_show(r)), "D")
        else:
            for h in hyp[h0:h1]:
                cell("*" * len(_show(h)), _show(h), "I")
    head = f"{utt} S={c['S']} D={c['D']} I={c['I']} C={c['C']}"
    marks = f"     {' '.join(m_row)}".rstrip()
    return f"{head}\nREF: {' '.join(r_row)}\nHYP: {' '.join(h_row)}\n{marks}\n\n"


def _show(token: str) -> str:
    return "<space>" if token == " " else token
