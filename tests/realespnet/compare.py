"""Strict comparisons between an upstream ESPnet3 run (the oracle) and ours.

Each ``*_problems`` function returns a list of human-readable problems (empty: the two agree). The
file list always comes from the oracle, and the oracle itself must be complete: a missing folder, a
folder with no test sets, a test set without its merged ``*.scp`` files or alignments, or a missing
``metrics.json`` is a problem on either side, never a silent pass.
"""

from __future__ import annotations

import re
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


# -- artifacts: merged scp files whose values name files (F5-TTS's wav.scp) -----------------------------

ARTIFACT_PATH = re.compile(r"^(?P<set>[^/]+)/split\.\d+/(?P<field>[^/]+)/(?P<name>[^/]+)$")


def _scp_rows(path: Path) -> list[tuple[str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(" ")
        rows.append((key, value))
    return rows


def _artifact(value: str, inference_dir: Path, cwd: Path) -> Path | None:
    """The file an scp value names (relative values are relative to the recipe folder, as ESPnet3
    writes them), when it lies in a shard folder of ``inference_dir``; else None (a plain value)."""
    path = Path(value) if Path(value).is_absolute() else cwd / value
    try:
        rel = path.resolve().relative_to(inference_dir.resolve())
    except ValueError:
        return None
    return path if ARTIFACT_PATH.match(rel.as_posix()) else None


def audio_summary(path: Path) -> str:
    """``rate Hz, frames samples, subtype`` of a sound file (for problem messages)."""
    import soundfile as sf

    info = sf.info(str(path))
    return f"{info.samplerate} Hz, {info.frames} samples, {info.subtype}"


def artifact_problems(oracle: Path, ours: Path, cwd: Path) -> tuple[list[str], list[str]]:
    """Two inference dirs whose merged ``*.scp`` name artifact files (``split.N/<field>/<id>.wav``):
    the same test sets and scp files, the same ids in the same order, every plain value verbatim, and
    every artifact the same file name under the same field with the same bytes. The scp lines
    themselves hold the folder and shard number, which differ by construction (another
    ``inference_dir``, another shard plan), so the scp files are compared through what they name.

    Returns ``(problems, compared)``: ``compared`` lists each artifact pair compared (for the report).
    """
    problems: list[str] = []
    compared: list[str] = []
    if not oracle.is_dir():
        return [f"oracle incomplete: no inference dir {oracle}"], compared
    if not ours.is_dir():
        return [f"no inference dir: {ours}"], compared
    sets = set_names(oracle)
    if not sets:
        return [f"oracle incomplete: no test-set folder in {oracle}"], compared
    if set_names(ours) != sets:
        problems.append(f"test sets {set_names(ours)} in {ours} vs oracle {sets}")
    for name in sets:
        scp = sorted(p.name for p in (oracle / name).glob("*.scp"))
        if not scp:
            problems.append(f"oracle incomplete: no merged *.scp in {oracle / name}")
            continue
        theirs = sorted(p.name for p in (ours / name).glob("*.scp")) if (ours / name).is_dir() else []
        if theirs != scp:
            problems.append(f"{ours / name}: merged files {theirs} vs oracle {scp}")
        for file in scp:
            if not (ours / name / file).is_file():
                problems.append(f"missing: {ours / name / file}")
                continue
            a, b = _scp_rows(oracle / name / file), _scp_rows(ours / name / file)
            if [k for k, _ in a] != [k for k, _ in b]:
                problems.append(f"{ours / name / file}: ids {[k for k, _ in b]} vs oracle {[k for k, _ in a]}")
                continue
            for (key, va), (_, vb) in zip(a, b):
                fa, fb = _artifact(va, oracle, cwd), _artifact(vb, ours, cwd)
                if fa is None and fb is None:
                    if va != vb:
                        problems.append(f"{ours / name / file}: {key}: {vb!r} vs oracle {va!r}")
                    continue
                if fa is None or fb is None:
                    problems.append(f"{ours / name / file}: {key}: {vb!r} vs oracle {va!r} (one is no artifact)")
                    continue
                if (fa.parent.name, fa.name) != (fb.parent.name, fb.name):
                    problems.append(
                        f"{ours / name / file}: {key}: {fb.parent.name}/{fb.name} vs oracle {fa.parent.name}/{fa.name}"
                    )
                    continue
                found = same_bytes(fa, fb)
                if found and fa.suffix == ".wav" and fa.is_file() and fb.is_file():
                    found = [f"{found[0]} ({audio_summary(fb)} vs oracle {audio_summary(fa)})"]
                problems += found
                compared.append(f"{name}/{file}:{key} -> {fb.parent.name}/{fb.name}")
    return problems, compared
