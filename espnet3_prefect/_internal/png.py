"""A small line chart written as a PNG with zlib + struct only (no plotting dependency).

Used for the score trend beside ``evaluate_history.jsonl``: one coloured line per series, points
at each run, a light grid, and the y range printed with a 3x5 pixel digit font; and for the workers'
throughput in the UI (:func:`bar_chart`: one bar per worker).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

PALETTE = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
]
COLOR_NAMES = ["blue", "red", "green", "orange", "purple", "brown", "pink", "cyan"]

# 3x5 glyphs, rows top to bottom, 3 bits each (4 = left pixel).
_FONT = {
    "0": (7, 5, 5, 5, 7),
    "1": (2, 6, 2, 2, 7),
    "2": (7, 1, 7, 4, 7),
    "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7),
    "6": (7, 4, 7, 5, 7),
    "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7),
    "9": (7, 5, 7, 1, 7),
    ".": (0, 0, 0, 0, 2),
    "-": (0, 0, 7, 0, 0),
    "%": (5, 1, 2, 4, 5),
    " ": (0, 0, 0, 0, 0),
}


def encode_png(rgb: bytes | bytearray, width: int, height: int) -> bytes:
    """8-bit RGB pixels (row-major, ``3 * width * height`` bytes) -> PNG file bytes."""
    if len(rgb) != 3 * width * height:
        raise ValueError(f"need {3 * width * height} bytes for {width}x{height} RGB, got {len(rgb)}")
    stride = 3 * width
    raw = b"".join(b"\x00" + bytes(rgb[y * stride : (y + 1) * stride]) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


class Canvas:
    def __init__(self, width: int, height: int, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def dot(self, x: int, y: int, color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color) -> None:
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.dot(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color, thick: int = 1) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            self.rect(x0 - thick // 2, y0 - thick // 2, x0 + (thick - 1) // 2, y0 + (thick - 1) // 2, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color, scale: int = 2) -> None:
        for ch in text:
            for row, bits in enumerate(_FONT.get(ch, _FONT[" "])):
                for col in range(3):
                    if bits & (4 >> col):
                        self.rect(
                            x + col * scale,
                            y + row * scale,
                            x + col * scale + scale - 1,
                            y + row * scale + scale - 1,
                            color,
                        )
            x += 4 * scale

    def png(self) -> bytes:
        return encode_png(self.pixels, self.width, self.height)


def _label(value: float) -> str:
    return f"{value:.2f}"


def line_chart(
    series: Sequence[Sequence[float | None]], width: int = 480, height: int = 240, marks: Sequence[tuple[int, int]] = ()
) -> bytes:
    """Plot each series (one value per run, ``None`` = missing) over the run index; PNG bytes.

    Series colours follow :data:`PALETTE` in order (:data:`COLOR_NAMES` names them). ``marks``:
    ``(series, point)`` pairs drawn with a black ring (the best checkpoint).
    """
    canvas = Canvas(width, height)
    values = [v for s in series for v in s if v is not None and math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 1.0, hi + 1.0
    lo = max(0.0, lo) if min(values or [0.0]) >= 0 else lo
    left, right, top, bottom = 60, width - 12, 12, height - 16
    grid, axis, ink = (230, 230, 230), (120, 120, 120), (60, 60, 60)
    for k in range(5):
        y = bottom - round(k * (bottom - top) / 4)
        canvas.line(left, y, right, y, grid)
    canvas.line(left, top, left, bottom, axis)
    canvas.line(left, bottom, right, bottom, axis)
    canvas.text(4, top, _label(hi), ink)
    canvas.text(4, bottom - 10, _label(lo), ink)
    n = max((len(s) for s in series), default=0)

    def x_of(i: int) -> int:
        return left + (round(i * (right - left) / (n - 1)) if n > 1 else (right - left) // 2)

    def y_of(v: float) -> int:
        return bottom - round((v - lo) * (bottom - top) / (hi - lo))

    for i in range(n):
        canvas.line(x_of(i), bottom, x_of(i), bottom + 3, axis)
    for index, s in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        points = [(x_of(i), y_of(v)) for i, v in enumerate(s) if v is not None and math.isfinite(v)]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            canvas.line(x0, y0, x1, y1, color, thick=2)
        for x, y in points:
            canvas.rect(x - 2, y - 2, x + 2, y + 2, color)
    for index, point in marks:
        value = series[index][point] if index < len(series) and point < len(series[index]) else None
        if value is not None and math.isfinite(value):
            x, y = x_of(point), y_of(value)
            for x0, y0, x1, y1 in (
                (x - 6, y - 6, x + 6, y - 5),
                (x - 6, y + 5, x + 6, y + 6),
                (x - 6, y - 6, x - 5, y + 6),
                (x + 5, y - 6, x + 6, y + 6),
            ):
                canvas.rect(x0, y0, x1, y1, (0, 0, 0))
    return canvas.png()


def bar_chart(values: Sequence[float | None], width: int = 480, bar_px: int = 16) -> bytes:
    """One horizontal bar per value, top to bottom, numbered from 1 at the left, its value printed at
    its end, lengths on one scale from 0 to the largest; ``None`` draws no bar. PNG bytes.

    >>> bar_chart([2.0, None, 1.0])[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
    """
    gap, left, right_margin = 6, 40, 70
    height = gap + len(values) * (bar_px + gap)
    canvas = Canvas(width, max(height, 2 * gap))
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    top_value = max(finite, default=1.0)
    span = width - left - right_margin
    ink, axis = (60, 60, 60), (120, 120, 120)
    canvas.line(left, 0, left, canvas.height - 1, axis)
    for row, value in enumerate(values):
        y = gap + row * (bar_px + gap)
        canvas.text(4, y + (bar_px - 10) // 2, str(row + 1), ink)
        if value is None or not math.isfinite(value):
            continue
        length = max(1, round(span * max(0.0, value) / top_value))
        canvas.rect(left + 1, y, left + length, y + bar_px - 1, PALETTE[0])
        canvas.text(left + length + 6, y + (bar_px - 10) // 2, _label(value), ink)
    return canvas.png()
