"""espnet2's ``TextCleaner`` for WER/CER's ``clean_types``: espnet2's own class where it is
importable, else the cleaners we can run (moved out of ``metrics.py``, which re-exports
:class:`TextCleaner`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from espnet3_prefect.errors import ConfigError

# -- text cleaning (espnet2's TextCleaner names) ----------------------------------------------------

_KOREAN_DIGITS = dict(zip("0123456789", "영일이삼사오육칠팔구"))
_KOREAN_LETTERS = dict(
    zip(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        (
            "에이 비 씨 디 이 에프 지 에이치 아이 제이 케이 엘 엠 엔 오 피 큐 알 에스 티 유 브이 더블유 엑스 와이 지"
        ).split(),
    )
)
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
        espnet_cls = espnet2_cleaner()
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
                raise ConfigError(
                    f"clean_types: {n!r} is not supported; espnet2's TextCleaner knows tacotron, "
                    "jaconv, vietnamese, korean_cleaner, whisper_en, whisper_basic"
                )
        return steps

    def __call__(self, text: str) -> str:
        if self._espnet is not None:  # pragma: no cover
            return self._espnet(text)
        for step in self._steps:
            text = step(text)
        return text


def espnet2_cleaner():
    """ESPnet2's ``TextCleaner`` class when espnet2 is installed, else None."""
    try:
        from espnet2.text.cleaner import TextCleaner as EspnetCleaner
    except ImportError:
        return None
    return EspnetCleaner  # pragma: no cover
