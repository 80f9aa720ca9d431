"""Merge: the runner's ``merge(shard_dirs)`` runs on the driver (:func:`merge_stage`, once every shard
is done and too few items were skipped); we record what it wrote.

Which files a merge produced is found by comparing the output folder before and after it (a
recipe's ``merge`` may return None, True, a dict or anything), and recorded with their checksums in
``.merged.json``, the commit record of a finished test set. The streamed, atomic
concatenation our own runners use is :func:`espnet3_prefect.disk.concat.concat_files`.

A test set planned in length order (``runner.max_duration`` over the whole test set) has shards whose
lines are in length order; once the runner's ``merge`` has concatenated them, each merged ``.scp`` is put
back in dataset order by its lines' ``utt_id`` (:func:`put_in_dataset_order`), before the commit record
is written: a merged file is never recorded, nor left as done, in any other order.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.atomic import atomic_open, atomic_write_text, file_digest
from espnet3_prefect.disk.concat import concat_files
from espnet3_prefect.disk.layout import DONE_NAME, FAILURES_NAME, MANIFEST_NAME, StageLayout, shard_index
from espnet3_prefect.disk.marker import read_marker
from espnet3_prefect.errors import Espnet3PrefectError

_NOT_OUTPUTS = (MANIFEST_NAME, FAILURES_NAME)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of the files under ``folder`` that a merge may write:
    shard folders, hidden files and our bookkeeping are left out."""
    found: dict[str, tuple[int, int]] = {}
    if not folder.is_dir():
        return found
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") and shard_index(d) is None]
        for name in files:
            if name.startswith(".") or name in _NOT_OUTPUTS:
                continue
            path = Path(root) / name
            stat = path.stat()
            found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def written_since(folder: Path, before: dict[str, tuple[int, int]]) -> list[Path]:
    """Files under ``folder`` that are new or changed since ``before`` (a :func:`snapshot`)."""
    return [folder / rel for rel, stat in sorted(snapshot(folder).items()) if before.get(rel) != stat]


def write_merged_record(layout: StageLayout, record: dict, outputs: list[Path]) -> dict:
    """Record a finished merge: its outputs (by name) with their checksums."""
    full = {
        **record,
        "outputs": {p.relative_to(layout.output_dir).as_posix(): str(p) for p in outputs},
        "digests": {p.relative_to(layout.output_dir).as_posix(): file_digest(p) for p in outputs},
    }
    atomic_write_text(layout.merged_record, json.dumps(full, sort_keys=True))
    return full


def read_merged_record(layout: StageLayout) -> dict | None:
    """What the last merge of this test set recorded, or None."""
    try:
        data = json.loads(layout.merged_record.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def merged_outputs_intact(layout: StageLayout, record: dict) -> str | None:
    """Why the recorded merged outputs cannot be trusted, or None when every one is unchanged."""
    for rel, digest in (record.get("digests") or {}).items():
        path = layout.output_dir / rel
        if not path.is_file() or file_digest(path) != digest:
            return f"merged output {rel} changed or is missing"
    return None


def remove_merged(layout: StageLayout) -> list[str]:
    """Delete the merged outputs the last merge recorded (they no longer match the shards)."""
    record = read_merged_record(layout) or {}
    removed = []
    for rel in record.get("outputs", {}):
        target = layout.output_dir / rel
        if target.is_file():
            target.unlink()
            removed.append(rel)
    layout.merged_record.unlink(missing_ok=True)
    return removed


def ready_to_merge(
    stage, shards: list, n_items: int, log_warning: Callable[..., Any], what: str | None = None
) -> tuple[list[Path], int]:
    """The shard folders to merge, in plan order, and the count of skipped items; fails when a shard
    is not done or too many items were skipped (``failures.jsonl`` gathered first)."""
    what = what or f"test set {stage.test_set!r}"
    layout = stage.layout
    dirs = [layout.shard_dir(s.index) for s in shards]
    missing = [d.name for d in dirs if not (d / DONE_NAME).is_file()]
    if missing:
        raise Espnet3PrefectError(f"{what}: cannot merge, not done: {', '.join(missing[:10])}")
    failed = skipped_items(dirs)
    _gather_failures(layout, dirs)
    if failed:
        log_warning(
            "%s: %d of %d items failed and were skipped; listed in %s", stage.test_set, failed, n_items, layout.failures
        )
    if n_items and failed / n_items > stage.max_failed_ratio:
        raise Espnet3PrefectError(
            f"{what}: {failed} of {n_items} items failed ({100 * failed / n_items:.1f}%), above "
            f"runner.max_failed_ratio {stage.max_failed_ratio}; see {layout.failures}"
        )
    return dirs, failed


def skipped_items(shard_dirs: list[Path]) -> int:
    """The items the shards' done markers record as skipped (``on_error: skip``)."""
    return sum((read_marker(d) or {}).get("failed", 0) for d in shard_dirs)


def _gather_failures(layout: StageLayout, dirs: list[Path]) -> None:
    """Concatenate the shards' failure lists into ``<test>/failures.jsonl`` (or remove a stale one)."""
    parts = [d / FAILURES_NAME for d in dirs if (d / FAILURES_NAME).is_file()]
    if parts:
        concat_files(parts, layout.failures)
    else:
        layout.failures.unlink(missing_ok=True)


def merge_stage(
    stage, shards: list, n_items: int, *, record: bool, log: Any, what: str | None = None
) -> tuple[Any, dict[str, str]]:
    """Merge ``shards`` (in plan order) with ``stage.runner.merge`` on this process; returns what that
    ``merge`` returned and the merged outputs by name. ``record``: write the commit record of a finished
    test set (``.merged.json``: the outputs the merge wrote, with checksums), as the infer stage does;
    a runner's own folder (``run-runner``) is not recorded. ``log`` is a logger."""
    layout = stage.layout
    dirs, failed = ready_to_merge(stage, shards, n_items, log.warning, what=what)
    started = time.perf_counter()
    reorder = stage.work.length_order
    if not record and not reorder:
        result = stage.runner.merge(dirs)
        log.info("merged %d shards of %s in %.2f s", len(dirs), layout.root, time.perf_counter() - started)
        return result, {}
    before = snapshot(layout.output_dir)
    result = stage.runner.merge(dirs)
    outputs = written_since(layout.output_dir, before)
    if reorder:
        moved = put_in_dataset_order(outputs, dirs, what or f"test set {stage.test_set!r}")
        log.info("%s: merged lines put back in dataset order (%d files)", stage.test_set, moved)
    if not record:
        return result, {}
    written = write_merged_record(
        layout,
        {
            "fingerprint": stage.work.fingerprint,
            "identity_fingerprint": stage.identity_fingerprint,
            "n_items": n_items,
            "num_shards": len(dirs),
            "failed": failed,
        },
        outputs,
    )
    log.info(
        "merged %d shards into %s in %.2f s: %s",
        len(dirs),
        layout.output_dir,
        time.perf_counter() - started,
        ", ".join(written["outputs"]) or "no files",
    )
    return result, {**written["outputs"], **({"failures": str(layout.failures)} if failed else {})}


def put_in_dataset_order(files: list[Path], shard_dirs: list[Path], what: str) -> int:
    r"""Sort the lines of each ``.scp`` in ``files`` by the dataset index of their ``utt_id`` (the first
    token), which the shards' done markers record (``keys``: ``[index, utt_id]`` for each result written);
    the bytes of each line are kept. Returns how many files were sorted. A ``utt_id`` of two items, or a
    line whose ``utt_id`` no shard recorded, fails on one line naming it: never a file in another order.

    >>> import json, tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "split.0").mkdir()
    >>> _ = (root / "split.0" / "done").write_text(json.dumps({"keys": [[2, "c"], [0, "a"], [1, "b"]]}))
    >>> _ = (root / "hyp.scp").write_text("c C\na A\nb B\n")
    >>> put_in_dataset_order([root / "hyp.scp"], [root / "split.0"], "test set 't'")
    1
    >>> (root / "hyp.scp").read_text()
    'a A\nb B\nc C\n'
    """
    position: dict[bytes, int] = {}
    for shard_dir in shard_dirs:
        for index, key in (read_marker(shard_dir) or {}).get("keys", []):
            earlier = position.setdefault(key.encode("utf-8"), index)
            if earlier != index:
                raise Espnet3PrefectError(
                    f"{what}: utt_id {key!r} is the id of items {earlier} and {index}; runner.max_duration puts "
                    f"the merged lines back in dataset order by utt_id, so each item needs its own (drop the key)"
                )
    sorted_files = 0
    for path in files:
        if path.suffix != ".scp":
            continue
        data = path.read_bytes()
        lines = data.split(b"\n")
        ends = lines[-1] == b""
        if ends:
            lines.pop()
        ranked = []
        for number, line in enumerate(lines):
            key = line.split(b" ", 1)[0]
            if key not in position:
                raise Espnet3PrefectError(
                    f"{what}: {path} line {number + 1}: {key.decode('utf-8', 'replace')!r} is not the utt_id of an "
                    f"item the shards wrote, so the file cannot be put back in dataset order (runner.max_duration)"
                )
            ranked.append((position[key], number))
        text = b"\n".join(lines[number] for _, number in sorted(ranked)) + (b"\n" if ends else b"")
        if text != data:
            with atomic_open(path, "wb") as out:
                out.write(text)
        sorted_files += 1
    return sorted_files
