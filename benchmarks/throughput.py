"""Throughput of a real ESPnet model: upstream's consecutive batches against batches by duration.

    .venv-espnet/bin/python -m benchmarks.throughput [--quick] [--json OUT]         # 2 CPU workers
    python3 -m benchmarks.throughput --device cuda --workers 1 --model-dir M --fsdd F  # the GPU run

The model is ``espnet2.bin.asr_inference.Speech2Text`` built from the mini_an4 recipe's own training
config (``conf/training.yaml`` -> the streaming debug config, trained one step on the CPU as
ESPnet's CI does: :func:`trained_recipe`, with the recipe taken from the installed wheel by
``tests/realespnet/conftest.py``), decoded by ESPnet3 202611's own ``ASRInferenceRunner`` with the
TEMPLATE's audio/text contract, through our ``infer`` flow (``parallel.env: local``). A batch is
one ``Speech2Text.batch_decode`` call, as 202611's runner makes it.

The audio (:class:`JoinedDigits`): FSDD recordings (0.2-2.3 s, 8 kHz, resampled to 16 kHz on read)
alone, and utterances made by joining 4-40 of them (2-20 s), in a shuffled (seeded) order, so that
a test set mixes short and long items as a real one does. ``lengths()`` are seconds read from the
WAV headers (no decode). References are the spoken digits as words ("ONE FOUR ...").

The runs, one after another on one embedded Prefect server, each into a fresh folder:

- ``upstream_b4``, ``upstream_b16``: no ``max_duration``: upstream's consecutive batches of
  ``batch_size`` 4 (the TEMPLATE default) and 16;
- ``duration_b4budget``, ``duration_b16budget``: ``runner.max_duration`` set to the largest padded
  batch (longest item x count, in seconds) of upstream's batching at 4 and at 16 over the same
  test set, ``batch_size`` 16 as the cap on the count: no batch is padded larger than one
  upstream already runs at that setting (the same memory budget), and short items fill up to 16;
- ``duration_b4budget_cap64``, ``duration_b16budget_cap64``: the same budgets with ``batch_size``
  64 as the cap (Lhotse's ``max_duration`` has no count cap at all): short items fill up to 64,
  the budget still bounds every batch's padded seconds.

Each run reports ``wall_s`` (the ``infer`` call: cluster start, model builds, decoding, merge),
``rtfx`` (audio seconds / wall seconds), ``padding_efficiency`` (real / padded seconds over the
batches run, as the run's summary sums them from its shards), ``wer``/``cer`` (word/character edit distance over
the references, ours: :func:`error_rate`) and whether its hypotheses and their line order equal
``upstream_b4``'s. With ``--bare``: the same model in this process over the duration batches of
the whole set, no flow (``bare_duration``), as the floor of what batching alone can give. On a GPU,
``gpu_busy`` is NVML's utilisation (sampled every 20 ms) averaged over the run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FSDD = Path(os.environ.get("E3P_FSDD", "/work/shared/data/fsdd/recordings"))
WORKDIR_VAR = "E3P_REALESPNET_WORKDIR"
RATE = 16000
WORDS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "espnet3-prefect" / "throughput-an4"
TRAINING_STAGES = ("create_dataset", "train_tokenizer", "collect_stats", "train")


# -- the audio --------------------------------------------------------------------------------------------
def wav_seconds(path: str) -> float:
    """Duration from the WAV header alone."""
    with wave.open(path, "rb") as handle:
        return handle.getnframes() / handle.getframerate()


def read_16k(path: str) -> np.ndarray:
    """One recording as float32 at 16 kHz (linear interpolation from its own rate)."""
    with wave.open(path, "rb") as handle:
        rate, frames = handle.getframerate(), handle.readframes(handle.getnframes())
    audio = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    if rate != RATE:
        positions = np.arange(int(len(audio) * RATE / rate)) * (rate / RATE)
        audio = np.interp(positions, np.arange(len(audio)), audio).astype(np.float32)
    return audio


class JoinedDigits:
    """``n_single`` FSDD recordings and ``n_joined`` utterances of ``join[0]``-``join[1]`` recordings
    joined, shuffled with ``seed``; items ``{"speech": float32 16 kHz, "text": "ONE FOUR ..."}``.

    >>> data = JoinedDigits(n_single=3, n_joined=2, join=(4, 5))
    >>> len(data), data[0]["speech"].dtype, len(data.lengths())
    (5, dtype('float32'), 5)
    >>> max(data.lengths()) / min(data.lengths()) > 3
    True
    """

    def __init__(self, root: str | None = None, n_single: int = 200, n_joined: int = 80, join=(4, 30), seed=0):
        paths = sorted(glob.glob(str(Path(root or FSDD) / "*.wav")))
        if not paths:
            raise FileNotFoundError(f"JoinedDigits: no *.wav under {root or FSDD} (set E3P_FSDD)")
        rng = random.Random(seed)
        singles = rng.sample(paths, n_single) if n_single <= len(paths) else rng.choices(paths, k=n_single)
        joined = [rng.choices(paths, k=rng.randint(*join)) for _ in range(n_joined)]
        self.items = [[p] for p in singles] + joined
        rng.shuffle(self.items)
        seconds = {p: wav_seconds(p) for p in {p for item in self.items for p in item}}
        self.seconds = np.array([sum(seconds[p] for p in item) for item in self.items], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, idx: int) -> dict:
        item = self.items[int(idx)]
        speech = np.concatenate([read_16k(p) for p in item])
        return {"speech": speech, "text": " ".join(WORDS[int(Path(p).name.split("_")[0])] for p in item)}

    def lengths(self) -> np.ndarray:
        return self.seconds


class Organizer:
    """``test``: a list of ``{"name", **JoinedDigits kwargs}``; ``.test[name]`` is the dataset."""

    def __init__(self, test=()):
        self.test = {t["name"]: JoinedDigits(**{k: v for k, v in t.items() if k != "name"}) for t in test}


# -- the model ----------------------------------------------------------------------------------------------
def trained_recipe(work: Path) -> Path:
    """The mini_an4 recipe folder with a trained model: ``$E3P_REALESPNET_WORKDIR``'s (as the mini_an4
    tests leave it) when it has one, else trained once into ``work`` by the recipe's own ``run.py``
    stages create_dataset, train_tokenizer, collect_stats and train (about 3 min on 2 cores)."""
    kept = os.environ.get(WORKDIR_VAR)
    for root in ([Path(kept)] if kept else []) + [work]:
        recipe = root / "egs3" / "mini_an4" / "esp2_asr"
        if model_files(recipe, check=False):
            return recipe
    sys.path.insert(0, str(ROOT))
    from tests.realespnet.conftest import TRAINING, copy_recipe, recipe_env

    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    recipe = copy_recipe(work)
    env = recipe_env(recipe, work / "prefect-home")
    for stage in TRAINING_STAGES:
        proc = subprocess.run(
            [sys.executable, "run.py", "--stages", stage, *TRAINING],
            cwd=recipe,
            env=env,
            capture_output=True,
            text=True,
        )
        (work / f"{stage}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode:
            raise RuntimeError(f"mini_an4 stage {stage} exited {proc.returncode} (log {work / f'{stage}.log'})")
    return recipe


MODEL_FILES = {  # name in a model folder: where the trained recipe has it
    "config.yaml": "exp/training/config.yaml",
    "model.ckpt": "exp/training/epoch0_step1_valid.loss.ckpt",  # the checkpoint the recipe's inference configs name
    "bpe.model": "data/bpe_30/bpe.model",
    "tokens.txt": "data/bpe_30/tokens.txt",
}
TOKENIZER_DIR = "./data/bpe_30/"  # how the training config names the tokenizer files (relative to the recipe)


def model_files(recipe: Path, check: bool = True) -> dict | None:
    """``{file name: path}`` of the trained recipe's model (:data:`MODEL_FILES`); None where one is
    missing and not ``check``."""
    found = {name: recipe / rel for name, rel in MODEL_FILES.items()}
    if all(p.is_file() for p in found.values()):
        return found
    if check:
        raise FileNotFoundError(f"no trained mini_an4 model under {recipe}: {MODEL_FILES}")
    return None


def copy_model(recipe: Path, dest: Path) -> Path:
    """The trained model's files under ``dest`` with :data:`MODEL_FILES`' names (what travels)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, path in model_files(recipe).items():
        shutil.copyfile(path, dest / name)
    return dest


def speech2text_args(model_dir: Path, work: Path) -> dict:
    """``Speech2Text``'s ``asr_train_config`` and ``asr_model_file`` for a model folder: its config
    copied to ``work`` with the tokenizer paths made absolute (they are relative to the recipe)."""
    text = (model_dir / "config.yaml").read_text()
    if TOKENIZER_DIR not in text:
        raise ValueError(f"{model_dir / 'config.yaml'}: no {TOKENIZER_DIR} paths to point at {model_dir}")
    config = work / "asr_config.yaml"
    config.write_text(text.replace(TOKENIZER_DIR, f"{model_dir.resolve()}/"))
    return {"asr_train_config": str(config), "asr_model_file": str((model_dir / "model.ckpt").resolve())}


# -- the runs -----------------------------------------------------------------------------------------------
def upstream_batches(n: int, batch_size: int, n_workers: int) -> list[list[int]]:
    """Upstream's consecutive batches of ``batch_size`` over ``range(n)``.

    >>> upstream_batches(5, 2, 2)
    [[0, 1], [2, 3], [4]]
    """
    return [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]


def largest_padded(batches: list[list[int]], seconds: np.ndarray) -> float:
    """The largest ``longest x count`` of ``batches``, in seconds.

    >>> largest_padded([[0, 1], [2]], np.array([1.0, 3.0, 5.0]))
    6.0
    """
    return max(float(max(seconds[b])) * len(b) for b in batches)


def config(args, model: dict, out_dir: Path, batch_size: int, max_duration: float | None) -> dict:
    """The inference config of one run: the TEMPLATE's model, contract, provider and runner."""
    runner = {"_target_": "espnet3.systems.esp2_asr.inference.ASRInferenceRunner"}
    if max_duration is not None:
        runner["max_duration"] = round(max_duration, 3)
    model_conf = {"_target_": "espnet2.bin.asr_inference.Speech2Text", **model, "beam_size": 1, "ctc_weight": 0.3}
    return {
        "inference_dir": str(out_dir),
        "dataset": {"_target_": "benchmarks.throughput.Organizer", "test": [dataset_args(args)]},
        "model": model_conf,
        "input_key": "speech",
        "batch_size": batch_size,
        "contract": {
            "inputs": {"speech": {"kind": "audio", "sample_rate": RATE, "rate_policy": "resample", "channels": 1}},
            "outputs": {"text": {"kind": "text"}},
        },
        "provider": {"_target_": "espnet3.systems.base.inference_provider.InferenceProvider"},
        "runner": runner,
        "parallel": {"env": args.env, "n_workers": args.workers, "num_shards": args.shards},
    }


def dataset_args(args) -> dict:
    return {"name": "digits", "root": str(args.fsdd), "n_single": args.n_single, "n_joined": args.n_joined}


def read_scp(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out.append((key, value))
    return out


def edits(ref: list, hyp: list) -> int:
    """Levenshtein distance.

    >>> edits(list("kitten"), list("sitting"))
    3
    """
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def error_rate(refs: list[str], hyps: list[str], unit: str) -> float:
    """Summed edit distance over summed reference length, in %, by ``word`` or ``char`` (spaces kept).

    >>> error_rate(["ONE TWO"], ["ONE TOO"], "word"), error_rate(["AB"], ["A"], "char")
    (50.0, 50.0)
    """
    split = str.split if unit == "word" else list
    errors = sum(edits(split(r), split(h)) for r, h in zip(refs, hyps))
    return round(100.0 * errors / max(1, sum(len(split(r)) for r in refs)), 2)


def run_infer(args, model, work: Path, name: str, batch_size: int, max_duration: float | None, sampler, seconds):
    import yaml

    from espnet3_prefect.flows.infer import infer

    out_dir = work / name
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(args, model, out_dir, batch_size, max_duration)))
    sampler.start()
    started = time.perf_counter()
    [summary] = infer(config=[str(path)])
    wall = time.perf_counter() - started
    busy = sampler.stop()
    test_dir = out_dir / "digits"
    padding = summary["timing"]["padding"]  # the batches the shards ran, summed from their reports
    return {
        "run": name,
        "batch_size": batch_size,
        "max_duration": max_duration,
        "wall_s": round(wall, 2),
        "gpu_busy": busy,
        "padding_efficiency": round(padding["real"] / padding["padded"], 3) if padding["padded"] else None,
        "hyp": read_scp(test_dir / "text.scp"),
    }


def run_bare(args, model: dict, dataset: JoinedDigits, batches: list[list[int]], sampler) -> dict:
    """Speech2Text in this process over ``batches`` (the duration batches of the whole set), reading
    each batch, decoding it; no flow, no workers."""
    import torch
    from espnet2.bin.asr_inference import Speech2Text

    sampler.start()
    started = time.perf_counter()
    device = "cuda" if args.device == "cuda" else "cpu"
    speech2text = Speech2Text(**model, beam_size=1, ctc_weight=0.3, device=device)
    built = time.perf_counter()
    texts: dict[int, str] = {}
    with torch.inference_mode():
        for batch in batches:
            results = speech2text([dataset[i]["speech"] for i in batch])
            for i, nbest in zip(batch, results):
                texts[i] = (nbest[0][0] or "") if nbest else ""
    wall = time.perf_counter() - started
    busy = sampler.stop()
    return {
        "run": "bare",
        "wall_s": round(wall, 2),
        "decode_s": round(wall - (built - started), 2),
        "gpu_busy": busy,
        "texts": texts,
    }


class NoSampler:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        return None


def sampler_for(device: str):
    if device != "cuda":
        return NoSampler()
    from benchmarks.gpu_batch import GpuSampler

    return GpuSampler()


def summarize(rows: list[dict], dataset: JoinedDigits, reference: str = "upstream_b4") -> None:
    """Adds rtfx, wer, cer, same_order and same_hyps (against ``reference``'s, else the first row's)
    and the wall time over the reference's to each row."""
    audio_s = float(dataset.seconds.sum())
    refs = [dataset[i]["text"] for i in range(len(dataset))]
    base = next((r for r in rows if r["run"] == reference), rows[0])
    first, base_wall = list(base["hyp"]), base["wall_s"]
    for row in rows:
        hyp = row.pop("hyp")
        texts = [value for _, value in hyp]
        row["rtfx"] = round(audio_s / row["wall_s"], 2)
        row["wer"] = error_rate(refs, texts, "word") if len(texts) == len(refs) else None
        row["cer"] = error_rate(refs, texts, "char") if len(texts) == len(refs) else None
        row["same_order_as"] = base["run"] if [k for k, _ in hyp] == [k for k, _ in first] else None
        row["same_hyps"] = sum(1 for a, b in zip(hyp, first) if a == b)
        row["wall_over_reference"] = round(row["wall_s"] / base_wall, 3)
        row["hyp_texts"] = texts


PLAN = (
    "upstream_b4",
    "upstream_b16",
    "duration_b4budget",
    "duration_b16budget",
    "duration_b4budget_cap64",
    "duration_b16budget_cap64",
)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 single + 30 joined items")
    parser.add_argument("--n-single", type=int, default=200)
    parser.add_argument("--n-joined", type=int, default=80)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=None, help="parallel.num_shards (default: 2 per worker)")
    parser.add_argument("--env", default="local")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: the bare loop's, and whether NVML is sampled")
    parser.add_argument("--fsdd", default=str(FSDD))
    parser.add_argument("--model-dir", help="a folder of MODEL_FILES (the GPU payload); default: the trained recipe's")
    parser.add_argument("--work", default=None, help="where the runs write (kept; default: a temporary folder)")
    parser.add_argument(
        "--runs",
        nargs="*",
        default=list(PLAN),
        choices=(*PLAN, "bare"),
        help="which runs, in this order ('bare': no flow)",
    )
    parser.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    parser.add_argument("--json", default=None, help="write the rows here (after every run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_single, args.n_joined = 60, 30
    args.shards = args.shards or 2 * args.workers
    started = time.monotonic()
    from espnet3_prefect.server.embedded import prefect_api

    work = Path(args.work or tempfile.mkdtemp(prefix="e3p-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        model_dir = copy_model(trained_recipe(CACHE), work / "model")
    model = speech2text_args(model_dir, work)
    dataset = JoinedDigits(**{k: v for k, v in dataset_args(args).items() if k != "name"})
    seconds = dataset.lengths()
    n = len(dataset)
    budgets = {b: largest_padded(upstream_batches(n, b, args.workers), seconds) for b in (4, 16)}
    head = {
        "items": n,
        "audio_s": round(float(seconds.sum()), 2),
        "shortest_s": round(float(seconds.min()), 3),
        "longest_s": round(float(seconds.max()), 3),
        "workers": args.workers,
        "num_shards": args.shards,
        "env": args.env,
        "device": args.device,
        "budgets_s": budgets,
    }
    print(json.dumps(head), flush=True)
    settings = {
        "upstream_b4": (4, None),
        "upstream_b16": (16, None),
        "duration_b4budget": (16, budgets[4]),
        "duration_b16budget": (16, budgets[16]),
        "duration_b4budget_cap64": (64, budgets[4]),
        "duration_b16budget_cap64": (64, budgets[16]),
    }
    sampler, rows = sampler_for(args.device), []

    def save(done: list[dict]) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps({**head, "rows": done}, indent=1))

    def bare_run() -> dict:
        from espnet3_prefect.pipeline.duration import duration_batches, padding

        batches = duration_batches(range(n), seconds, budgets[16], 16)
        bare = run_bare(args, model, dataset, batches, sampler)
        summed = padding(batches, {i: float(seconds[i]) for i in range(n)})
        bare["padding_efficiency"] = round(summed["real"] / summed["padded"], 3)
        texts = bare.pop("texts")
        bare["hyp"] = [(str(i), texts[i]) for i in range(n)]  # the merged files' keys: the dataset index
        return bare

    with prefect_api(work / "home", ui=False):
        warm = argparse.Namespace(**{**vars(args), "n_single": 4, "n_joined": 0})
        run_infer(warm, model, work, "warmup", 4, None, NoSampler(), seconds)  # first-flow costs (fork server, imports)
        for name in args.runs:
            if args.budget_s and time.monotonic() - started > args.budget_s:
                print(f"{name}: skipped (past --budget-s {args.budget_s:g})", flush=True)
                continue
            row = (
                bare_run() if name == "bare" else run_infer(args, model, work, name, *settings[name], sampler, seconds)
            )
            print(json.dumps({k: v for k, v in row.items() if k != "hyp"}), flush=True)
            rows.append(row)
            save([{k: v for k, v in r.items() if k != "hyp"} for r in rows])
    summarize(rows, dataset)
    save(rows)
    print(f"\n{'run':<26} {'wall_s':>7} {'/ ref':>6} {'rtfx':>7} {'pad_eff':>7} {'wer':>7} {'cer':>7} same order busy")
    for row in rows:
        print(
            f"{row['run']:<26} {row['wall_s']:>7.2f} {row['wall_over_reference']:>6.3f} {row['rtfx']:>7.2f} "
            f"{row.get('padding_efficiency') or 0:>7.3f} {row['wer'] or 0:>7.2f} {row['cer'] or 0:>7.2f} "
            f"{row['same_hyps']:>4}/{n}  {row['same_order_as']} {row.get('gpu_busy')}"
        )
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return rows


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
