"""Strict comparisons between an upstream ESPnet3 run (the oracle) and ours.

Each ``*_problems`` function returns a list of human-readable problems (empty: the two agree). The
file list always comes from the oracle, and the oracle itself must be complete: a missing folder, a
folder with no test sets, a test set without its merged ``*.scp`` files or alignments, or a missing
``metrics.json`` is a problem on either side, never a silent pass.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ALIGNMENTS = ("wer_alignment", "cer_alignment")
STATS_MODES = ("train", "valid")
# collect_stats sums depend on the order shards are added in: equal up to rounding.
STATS_RTOL = 1e-5
STATS_EXACT_KEYS = ("count",)


def _first_difference(a: bytes, b: bytes) -> str:
    lines_a, lines_b = a.splitlines(), b.splitlines()
    for number, (left, right) in enumerate(zip(lines_a, lines_b), 1):
        if left != right:
            return f"line {number}: {left[:120]!r} != {right[:120]!r}"
    return f"{len(lines_a)} lines vs {len(lines_b)} lines ({len(a)} vs {len(b)} bytes)"


def same_bytes(oracle: Path, ours: Path) -> list[str]:
    """[] when both files exist, are non-empty and hold the same bytes."""
    problems = [f"missing: {p}" for p in (oracle, ours) if not p.is_file()]
    if problems:
        return problems
    a, b = oracle.read_bytes(), ours.read_bytes()
    if not a:
        return [f"empty oracle file: {oracle}"]
    return [] if a == b else [f"differs: {ours} vs {oracle}: {_first_difference(a, b)}"]


def set_names(inference_dir: Path) -> list[str]:
    """Names of the test-set folders of an inference dir (sorted)."""
    return sorted(p.name for p in inference_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def merged_scp(test_set_dir: Path) -> list[str]:
    """The merged ``*.scp`` files of one test set, relative to it: ``text.scp``, ``dataset/text.scp``...
    (a shard's files live in sub-folders of their own and are not included)."""
    found = [p.name for p in test_set_dir.glob("*.scp") if p.is_file()]
    found += [f"dataset/{p.name}" for p in (test_set_dir / "dataset").glob("*.scp") if p.is_file()]
    return sorted(found)


def compared_files(inference_dir: Path) -> list[str]:
    """Every file of the oracle's inference dir the comparison covers, relative to it.

    Raises AssertionError when the oracle is not a complete upstream result.
    """
    assert inference_dir.is_dir(), f"no inference dir: {inference_dir}"
    sets = set_names(inference_dir)
    assert sets, f"no test-set folder in {inference_dir}"
    files = ["metrics.json"]
    for name in sets:
        scp = merged_scp(inference_dir / name)
        assert any("/" not in s for s in scp), f"no merged *.scp in {inference_dir / name}"
        assert any(s.startswith("dataset/") for s in scp), f"no dataset/*.scp in {inference_dir / name}"
        files += [f"{name}/{s}" for s in scp] + [f"{name}/{a}" for a in ALIGNMENTS]
    return files


def inference_problems(oracle: Path, ours: Path) -> list[str]:
    """Byte-for-byte agreement of two inference dirs: merged scp, alignments and metrics.json."""
    try:
        files = compared_files(oracle)
    except AssertionError as err:
        return [f"oracle incomplete: {err}"]
    if not ours.is_dir():
        return [f"no inference dir: {ours}"]
    problems = []
    missing_sets = sorted(set(set_names(oracle)) - set(set_names(ours)))
    if missing_sets:
        problems.append(f"test sets missing from {ours}: {missing_sets}")
    for name in set_names(oracle):
        extra = sorted(set(merged_scp(ours / name)) - set(merged_scp(oracle / name)))
        if extra:
            problems.append(f"merged files the oracle does not have in {ours / name}: {extra}")
    for rel in files:
        problems += same_bytes(oracle / rel, ours / rel)
    return problems


def _stats_files(folder: Path) -> tuple[list[str], list[str]]:
    shapes = sorted(p.name for p in folder.glob("*_shape") if p.is_file())
    npz = sorted(p.name for p in folder.glob("*_stats.npz") if p.is_file())
    return shapes, npz


def npz_problems(oracle: Path, ours: Path, rtol: float = STATS_RTOL) -> list[str]:
    """Counts equal, every other array within ``rtol`` (shapes and key sets equal)."""
    problems = [f"missing: {p}" for p in (oracle, ours) if not p.is_file()]
    if problems:
        return problems
    with np.load(oracle) as a, np.load(ours) as b:
        if not a.files:
            return [f"no arrays in oracle file: {oracle}"]
        if sorted(a.files) != sorted(b.files):
            return [f"{ours}: arrays {sorted(b.files)} vs oracle {sorted(a.files)}"]
        for key in sorted(a.files):
            x, y = a[key], b[key]
            if x.shape != y.shape:
                problems.append(f"{ours}[{key}]: shape {y.shape} vs oracle {x.shape}")
            elif key in STATS_EXACT_KEYS:
                if not np.array_equal(x, y):
                    problems.append(f"{ours}[{key}]: {y.tolist()} vs oracle {x.tolist()}")
            elif not np.allclose(x, y, rtol=rtol, atol=0.0):
                worst = float(np.max(np.abs(x - y) / np.maximum(np.abs(x), np.finfo(float).tiny)))
                problems.append(f"{ours}[{key}]: relative difference up to {worst:.3g} (> {rtol})")
    return problems


def stats_problems(oracle: Path, ours: Path) -> list[str]:
    """collect_stats outputs: ``*_shape`` and ``stats_keys`` byte-equal, ``*_stats.npz`` close."""
    problems = []
    for mode in STATS_MODES:
        a, b = oracle / mode, ours / mode
        if not a.is_dir():
            problems.append(f"oracle incomplete: no folder {a}")
            continue
        if not b.is_dir():
            problems.append(f"no folder {b}")
            continue
        shapes, npz = _stats_files(a)
        if not shapes or not npz:
            problems.append(f"oracle incomplete: {a} has shape files {shapes} and stats {npz}")
            continue
        their_shapes, their_npz = _stats_files(b)
        if (their_shapes, their_npz) != (shapes, npz):
            problems.append(f"{b}: files {their_shapes + their_npz} vs oracle {shapes + npz}")
        for name in shapes + ["stats_keys"]:
            problems += same_bytes(a / name, b / name)
        for name in npz:
            problems += npz_problems(a / name, b / name)
    return problems


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file under ``folder`` ({} when it does not exist)."""
    if not folder.is_dir():
        return {}
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
