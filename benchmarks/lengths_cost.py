"""What item lengths cost on the driver (pipeline/lengths.py), side by side: decoding every file (the
baseline: what reading ``dataset[i]`` would cost), reading the headers, and a cache hit.

    .venv/bin/python -m benchmarks.lengths_cost [--long 60]

Over the FSDD recordings (``../shared/data/fsdd/recordings``, 0.1-1.3 s each) and over ``--long``
files of about 20 s made by joining recordings (in a temporary folder), page cache warm, best of 3.
A reading, not a test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from espnet3_prefect.pipeline.lengths import header_lengths

FSDD = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fsdd" / "recordings"


def _best(call, k: int = 3):
    times, value = [], None
    for _ in range(k):
        start = time.perf_counter()
        value = call()
        times.append(time.perf_counter() - start)
    return min(times), value


def measure(paths: list[str]) -> str:
    import soundfile as sf

    for path in paths:
        Path(path).read_bytes()  # warm
    decode_s, decoded = _best(lambda: np.array([len(sf.read(p)[0]) / sf.info(p).samplerate for p in paths]))
    header_s, headers = _best(lambda: header_lengths(paths, None))
    cache = Path(tempfile.mkdtemp()) / "lengths.npz"
    header_lengths(paths, cache)
    hit_s, hit = _best(lambda: header_lengths(paths, cache))
    assert np.allclose(decoded, headers, rtol=0, atol=1e-9) and np.array_equal(headers, hit)
    return (
        f"{len(paths)} files, {headers.sum():.1f} s of audio ({headers.min():.2f}-{headers.max():.2f} s): "
        f"decode {decode_s * 1e3:.1f} ms, headers {header_s * 1e3:.1f} ms ({decode_s / header_s:.2f}x faster), "
        f"cache hit {hit_s * 1e3:.1f} ms ({header_s / hit_s:.1f}x faster than headers)"
    )


def long_files(folder: Path, count: int) -> list[str]:
    """``count`` files of ~20 s, each 10 recordings joined 5 times (16-bit PCM, 8 kHz)."""
    import soundfile as sf

    sources = sorted(FSDD.glob("*.wav"))
    made = []
    for k in range(count):
        parts = [sf.read(p)[0] for p in sources[(k * 10) % len(sources) :][:10]] * 5
        path = folder / f"long_{k:03d}.wav"
        sf.write(path, np.concatenate(parts), 8000, subtype="PCM_16")
        made.append(str(path))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=60, help="how many ~20 s files to make")
    args = parser.parse_args()
    if not FSDD.is_dir():
        raise SystemExit(f"no recordings at {FSDD}")
    print("fsdd:", measure([str(p) for p in sorted(FSDD.glob("*.wav"))]))
    with tempfile.TemporaryDirectory() as folder:
        print("long:", measure(long_files(Path(folder), args.long)))


if __name__ == "__main__":
    main()
