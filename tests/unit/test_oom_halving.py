"""A batch that runs out of memory under ``runner.max_duration``: split in halves on the same worker, down to
one item; only a single item that does not fit fails, naming its utterance; results still reach the hooks
as without a halving (in dataset order within each shard; in the whole-set length order, batch by batch,
each line's item in the marker); said once per shard; without the key nothing is halved (upstream's
batches fail as upstream's do). The model is a real torch module that raises torch's own out-of-memory
error above a batch size, as a GPU whose memory holds that many items would (and, on a GPU, the real
allocator's: ``benchmarks/gpu_payload/oom_check.sh``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from espnet3_prefect.disk.layout import StageLayout  # noqa: E402
from espnet3_prefect.disk.marker import read_marker  # noqa: E402
from espnet3_prefect.errors import ItemError  # noqa: E402
from espnet3_prefect.pipeline.oom import halves, is_out_of_memory  # noqa: E402
from espnet3_prefect.pipeline.plan import plan_length_order, plan_shards  # noqa: E402
from espnet3_prefect.pipeline.shard import process_shard  # noqa: E402

LENGTHS = [3.0, 1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 4.0, 1.0, 6.0, 2.0, 3.0, 2.5, 1.5]
DATA = [{"utt_id": f"utt{i:02d}", "x": float(i)} for i in range(len(LENGTHS))]


def _oom(message: str) -> Exception:
    """torch's own out-of-memory error (a RuntimeError with CUDA's message where it cannot be built)."""
    for cls in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)):
        if cls is not None:
            try:
                return cls(message)
            except TypeError:
                continue
    return RuntimeError(f"CUDA out of memory. {message}")


class Budgeted(torch.nn.Module):
    """A linear layer over a padded batch that raises torch's OOM error when the padded batch (items x
    longest length) exceeds ``fits`` units, or when a batch holds the utterance ``never_fits``."""

    def __init__(self, fits: float, never_fits: int | None = None):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        torch.nn.init.constant_(self.layer.weight, 2.0)
        torch.nn.init.constant_(self.layer.bias, 1.0)
        self.fits, self.never_fits = fits, never_fits
        self.sizes: list[int] = []

    def forward(self, xs: list[float], ids: list[int]) -> list[float]:
        padded = len(ids) * max(LENGTHS[i] for i in ids)
        if padded > self.fits or self.never_fits in ids:
            raise _oom(f"Tried to allocate {padded:.0f} units; {self.fits:.0f} fit")
        self.sizes.append(len(ids))
        with torch.no_grad():
            return self.layer(torch.tensor(xs).unsqueeze(1)).squeeze(1).tolist()


class Runner:
    writes: list = []

    @staticmethod
    def forward(idx, dataset, model, **env):
        items = idx if isinstance(idx, list) else [idx]
        ys = model([dataset[i]["x"] for i in items], items)
        return [{"utt_id": dataset[i]["utt_id"], "y": y} for i, y in zip(items, ys)]

    @staticmethod
    def open_writers(shard_dir, **env):
        return {"out": (shard_dir / "hyp.scp").open("w")}

    @staticmethod
    def write_record(writers, result, state, **env):
        Runner.writes.append([r["utt_id"] for r in result])
        for r in result:
            writers["out"].write(f"{r['utt_id']} {r['y']:.1f}\n")

    @staticmethod
    def close_writers(writers, state, **env):
        writers["out"].close()


def _run(tmp_path, model, max_duration, on_error="fail", length_order=False):
    Runner.writes = []
    if length_order:  # the whole test set sorted (a runner whose merge the driver reorders)
        [shard] = plan_length_order("t", LENGTHS, 1, 8, max_duration)
    else:
        [shard] = plan_shards("t", len(LENGTHS), 1, 8, lengths=LENGTHS, max_duration=max_duration)
    layout = StageLayout(tmp_path)
    said: list[str] = []
    env = {"dataset": DATA, "model": model, "output_dir": str(tmp_path)}
    summary = process_shard(Runner, shard, env, layout, on_error=on_error, prefetch=0, log=said.append)
    return summary, (layout.shard_dir(0) / "hyp.scp").read_text(), said


def test_torch_oom_is_recognised_in_the_cause_chain():
    assert is_out_of_memory(_oom("x"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    wrapped = ValueError("decode failed")
    wrapped.__cause__ = _oom("y")
    assert is_out_of_memory(wrapped)
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(None)
    assert halves([1]) == ([1], []) and halves([1, 2]) == ([1], [2])


def test_a_batch_that_does_not_fit_is_halved_down_to_what_fits_and_written_in_dataset_order(tmp_path):
    _, expected, _ = _run(tmp_path / "roomy", Budgeted(fits=1e9), 24.0)
    expected_writes = Runner.writes
    model = Budgeted(fits=9.0)  # 24 s batches never fit; halves of them do, down to what fits
    summary, text, said = _run(tmp_path / "tight", model, 24.0)
    assert text == expected  # every item, the same line, in dataset order
    assert Runner.writes == expected_writes  # grouped as upstream's batches of 8
    assert [line.split()[0] for line in text.splitlines()] == [d["utt_id"] for d in DATA]
    assert max(model.sizes) < 8 and sum(model.sizes) == len(DATA)  # each item decoded once, in smaller batches
    assert summary["failed"] == 0 and (tmp_path / "tight" / "split.0" / "done").exists()
    assert len(said) == 1 and "ran out of memory" in said[0] and "halves" in said[0]  # once per shard
    assert summary["oom_halvings"] >= 2
    padded = summary["padding"]  # measured on the batches that ran: each within what fits
    assert (
        padded["batches"] == len(model.sizes)
        and padded["real"] == sum(LENGTHS)
        and padded["padded"] <= 9.0 * len(model.sizes)
    )


def test_in_length_order_a_batch_that_does_not_fit_is_halved_and_every_line_keeps_its_item(tmp_path):
    """The whole test set sorted: the shard writes batch by batch; a halved batch is handed over whole,
    once both halves ran, and the marker says which item each line is (what the merge reorders by)."""
    _, expected, _ = _run(tmp_path / "roomy", Budgeted(fits=1e9), 24.0, length_order=True)
    model = Budgeted(fits=9.0)
    summary, text, said = _run(tmp_path / "tight", model, 24.0, length_order=True)
    assert text == expected and summary["oom_halvings"] >= 2 and max(model.sizes) < 8
    assert sorted(text.splitlines()) == sorted(f"{d['utt_id']} {2 * d['x'] + 1:.1f}" for d in DATA)
    keys = read_marker(tmp_path / "tight" / "split.0")["keys"]
    assert (
        [f"utt{i:02d}" for i, _ in keys] == [key for _, key in keys] == [line.split()[0] for line in text.splitlines()]
    )
    assert len(said) == 1 and "ran out of memory" in said[0]


def test_only_a_single_item_that_does_not_fit_fails_naming_its_utterance(tmp_path):
    with pytest.raises(ItemError, match=r"item 9 \(utt_id='utt09'\): .*(OutOfMemoryError|out of memory)"):
        _run(tmp_path, Budgeted(fits=1e9, never_fits=9), 24.0)
    assert not (tmp_path / "split.0" / "done").exists()


def test_under_skip_only_the_item_that_does_not_fit_is_left_out(tmp_path):
    summary, text, _ = _run(tmp_path, Budgeted(fits=9.0, never_fits=9), 24.0, on_error="skip")
    ids = [line.split()[0] for line in text.splitlines()]
    assert ids == [d["utt_id"] for d in DATA if d["utt_id"] != "utt09"] and summary["failed"] == 1
    assert "utt09" in (tmp_path / "split.0" / "failures.jsonl").read_text()


def test_without_max_duration_nothing_is_halved(tmp_path):
    model = Budgeted(fits=9.0)
    with pytest.raises(ItemError, match=r"^items 0\.\.7 .*(OutOfMemoryError|out of memory)"):
        _run(tmp_path, model, None)
    assert model.sizes == []  # upstream's batch of 8 failed as upstream's would: no smaller batch was tried


class CudaHungry(torch.nn.Module):
    """On a real GPU: each item of a batch takes a third of the memory free at the start, so a batch of
    four runs out of memory (torch's own CUDA error) and its halves of two fit."""

    def __init__(self):
        super().__init__()
        free, _ = torch.cuda.mem_get_info()
        self.per_item = int(free // 3) // 4  # float32 elements
        self.sizes: list[int] = []

    def forward(self, xs: list[float], ids: list[int]) -> list[float]:
        block = torch.empty(len(ids) * self.per_item, device="cuda")  # raises torch.OutOfMemoryError
        block.fill_(1.0)
        self.sizes.append(len(ids))
        del block
        return [2.0 * x + 1.0 for x in xs]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the real allocator's error)")
@pytest.mark.parametrize("length_order", [False, True], ids=["each-shard-sorted", "whole-set-sorted"])
def test_on_a_gpu_a_real_cuda_out_of_memory_batch_is_halved(tmp_path, length_order):
    global LENGTHS, DATA
    saved = LENGTHS, DATA
    LENGTHS, DATA = [1.0] * 8, [{"utt_id": f"utt{i:02d}", "x": float(i)} for i in range(8)]
    try:
        _, expected, _ = _run(tmp_path / "roomy", Budgeted(fits=1e9), 100.0, length_order=length_order)
        model = CudaHungry()
        summary, text, said = _run(tmp_path / "gpu", model, 100.0, length_order=length_order)  # 8, 4 out; 2 fit
    finally:
        LENGTHS, DATA = saved
        torch.cuda.empty_cache()
    assert text == expected and summary["oom_halvings"] >= 1 and max(model.sizes) <= 2
    assert len(said) == 1 and "ran out of memory" in said[0]
