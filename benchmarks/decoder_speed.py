"""The demo's DTMFDecoder on the CPU: milliseconds per item for one batch of 32 synthetic utterances.

    .venv/bin/python -m benchmarks.decoder_speed [--batch 32] [--reps 10]

A reading, not a test: it used to be printed by a unit test that asserted nothing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dtmf_demo.decoder import DTMFDecoder, collate
from dtmf_demo.dtmf import KEYS, synthesize


def ms_per_item(batch: int = 32, reps: int = 10, seed: int = 7) -> tuple[float, float]:
    """(ms per item, mean seconds of audio per item) for ``reps`` calls on one batch, after a warm-up."""
    rng = np.random.default_rng(seed)
    digits = ["".join(KEYS[int(k)] for k in rng.integers(0, 10, size=int(rng.integers(3, 9)))) for _ in range(batch)]
    waves, lengths = collate([synthesize(d, seed=i) for i, d in enumerate(digits)])
    decoder = DTMFDecoder()
    decoder(waves, lengths)
    start = time.perf_counter()
    for _ in range(reps):
        decoder(waves, lengths)
    return (time.perf_counter() - start) / reps / batch * 1e3, lengths.float().mean().item() / 8000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    ms, audio_s = ms_per_item(args.batch, args.reps)
    print(f"DTMFDecoder CPU: {ms:.3f} ms/item (batch of {args.batch}, {audio_s:.2f} s audio/item)")


if __name__ == "__main__":
    main()
