"""Benchmark groups about the data: loading overlapped with compute (``prefetch``) and uneven
utterances balanced on ``lengths()`` (``balance``). Run through :mod:`benchmarks.run`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from espnet3_prefect.execution.backends.allocator import allocator_settings

from . import audio, baselines, synthetic

if TYPE_CHECKING:
    from .run import Suite

PF_MODEL = {"channels": 128, "layers": 3}  # forward ~2.1 ms per item beside ~1.4 ms of loading (calibrated)


def prefetch(s: Suite) -> None:
    """Loading overlapped with compute: FSDD recordings read and turned into log-mel features on every
    ``dataset[i]`` (page cache dropped before each run), a torch model of comparable cost; 1 worker
    (this machine has 2 cores: the reading thread and the model each get one). ESPnet3's plain-Dask
    design reads inside forward, serially; ours reads the next batches in a background thread."""
    from espnet3_prefect.pipeline.plan import default_num_shards

    n = 600 if s.quick else 2400
    load, compute = audio.calibrate(n=100 if s.quick else 300, **PF_MODEL)
    ideal = max(load, compute) * n  # one worker: the slower of the two, per item, for every item
    shards = default_num_shards(n, 1)
    fields = ("digit", "frames")
    paths = audio.recordings()
    audio.evict(paths)
    dask_stage = s.stage_of(s.write_config("pf_dask", audio.config(str(s.work / "pf_dask"), n, 1, **PF_MODEL)))
    dask = baselines.plain_dask(dask_stage, n, 1, shards, s.work / "pf_dask_out", fields=fields)
    audio.evict(paths)  # the same design with our workers' allocator setting: what prefetch alone gains
    dask_glibc = baselines.plain_dask(
        dask_stage, n, 1, shards, s.work / "pf_dask_glibc", fields=fields, dask_settings=allocator_settings()
    )
    walls, summaries = {}, {}
    for label, depth in (("on", None), ("off", 0)):
        audio.evict(paths)
        path = s.write_config(
            f"pf_{label}", audio.config(str(s.work / f"pf_{label}"), n, 1, prefetch=depth, **PF_MODEL)
        )
        walls[label], summaries[label] = s.infer_config(path)
    outputs = [(s.work / "pf_dask_out" / f"{f}.scp").read_bytes() for f in fields]
    same = all(
        outputs == [(s.work / f"pf_{label}/fsdd/{f}.scp").read_bytes() for f in fields] for label in ("on", "off")
    )
    on = summaries["on"]["timing"]
    s.record(
        "prefetch",
        "load / compute per item, in-process [ms]",
        load * 1000,
        note=f"compute {compute * 1000:.2f} ms; {n} items, 1 worker",
    )
    s.record("prefetch", "plain Dask (ESPnet3 design, reads inside forward) [s]", dask)
    s.record(
        "prefetch",
        "infer, prefetch on (default) [s]",
        walls["on"],
        note="outputs identical" if same else "OUTPUTS DIFFER",
    )
    s.record("prefetch", "infer, prefetch off [s]", walls["off"])
    s.record("prefetch", "plain Dask, workers without Dask's MALLOC_TRIM_THRESHOLD_ (as ours) [s]", dask_glibc)
    s.record("prefetch", "infer (prefetch on) / plain Dask", walls["on"] / dask, "<= 0.85")
    s.record("prefetch", "infer (prefetch on) / plain Dask with our allocator setting", walls["on"] / dask_glibc)
    s.record("prefetch", "infer prefetch on / off", walls["on"] / walls["off"])
    s.record(
        "prefetch",
        "shard wall (prefetch on) / max(load, compute)",
        on["wall_s"] / ideal,
        "<= 1.15",
        f"{on['wall_s']:.2f} s vs {ideal:.2f} s; in shards: load {on['load_s']:.1f} s, waited "
        f"{on['wait_s']:.1f} s, forward {on['forward_s']:.1f} s, write {on['write_s']:.1f} s",
    )
    from espnet3_prefect.pipeline.report import summary_rows

    [row] = summary_rows([summaries["on"]])
    s.record(
        "report",
        "what the summary says for the prefetch run: utilisation",
        row["utilisation"] or 0.0,
        note=f"bound by {row['bound']}",
    )


def balance(s: Suite) -> None:
    """Uneven utterances: log-normal lengths (longest / shortest >= 20), sorted by length, forward cost
    proportional to length, 2 workers: shards balanced on lengths() vs equal-count shards (same data)."""
    n = 800 if s.quick else 2000
    unit_ms = 6.0
    lengths = synthetic.uneven_lengths(n)
    work = sum(lengths) * unit_ms / 1000  # seconds of forward in total
    spread = max(lengths) / min(lengths)
    walls, summaries = {}, {}
    for label, with_lengths in (("balanced", True), ("equal", False)):
        path = s.write_config(
            f"bal_{label}", synthetic.uneven_config(str(s.work / f"bal_{label}"), n, unit_ms, 2, with_lengths)
        )
        walls[label], summaries[label] = s.infer_config(path)
    same = (s.work / "bal_balanced/bench/y.scp").read_bytes() == (s.work / "bal_equal/bench/y.scp").read_bytes()
    for label in ("balanced", "equal"):
        timing = summaries[label]["timing"]
        s.record(
            "balance",
            f"{label} shards: shard wall / (work / workers)",
            timing["wall_s"] / (work / 2),
            "<= 1.15" if label == "balanced" else "",
            f"{timing['wall_s']:.2f} s vs {work / 2:.2f} s; flow {walls[label]:.2f} s"
            + ("; outputs identical" if same else "; OUTPUTS DIFFER") * (label == "balanced"),
        )
    s.record("balance", "longest / shortest utterance", spread, ">= 20", f"{n} items, log-normal, sorted")
    s.record(
        "balance",
        "balanced / equal shard wall",
        summaries["balanced"]["timing"]["wall_s"] / summaries["equal"]["timing"]["wall_s"],
    )
