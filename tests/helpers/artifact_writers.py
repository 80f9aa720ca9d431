"""Custom ``output_artifacts`` writers and a picklable object for the artifact tests."""

from __future__ import annotations

from pathlib import Path


def write_text(value, output_path: Path, suffix: str = ".txt", upper: bool = False, **options) -> Path:
    """Write ``str(value)`` (upper-cased on request) to ``output_path`` + ``suffix``."""
    path = Path(output_path).with_name(Path(output_path).name + suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = str(value) + "".join(f" {key}={options[key]}" for key in sorted(options))
    path.write_text(text.upper() if upper else text, encoding="utf-8")
    return path


def return_missing(value, output_path: Path) -> Path:
    return Path(output_path).with_name("never-written")


def return_number(value, output_path: Path) -> int:
    return 3


class Thing:
    """A plain object: written as a pickle."""

    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Thing) and other.x == self.x
