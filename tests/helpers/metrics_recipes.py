"""Inference folders, tiny organizers and a custom metric for the metrics tests (unit and parity).

Run as a module it scores a folder in a venv where ESPnet3 202611 is importable, either with
upstream's ``measure()`` or with our metrics flow (``PREFECT_API_URL`` set)::

    PY -m tests.helpers.metrics_recipes measure|ours METRICS.yaml [--inference-config INFER.yaml] [key=value ...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:  # the custom metric subclasses whichever BaseMetric this venv has
    from espnet3.components.metrics.base_metric import BaseMetric
    from espnet3.contract import Field
except ImportError:
    from espnet3_prefect.metrics import BaseMetric, Field

WORDS = ["alpha", "beta", "gamma", "delta", "épsilon", "ζeta", "東京", "한국어", "naïve", "x"]


def _sentence(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


def many_rows(n: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``n`` utterances with every kind of error, some empty on either side (deterministic)."""
    refs, hyps = [], []
    for i in range(n):
        ref = _sentence(i, 1 + i % 6)
        words = ref.split()
        kind = i % 9
        if kind == 0:
            hyp = ref
        elif kind == 1:
            hyp = " ".join(words[:-1])  # deletion
        elif kind == 2:
            hyp = ref + " extra"  # insertion
        elif kind == 3:
            hyp = " ".join(["zz", *words[1:]])  # substitution
        elif kind == 4:
            hyp = ""  # empty hyp
        elif kind == 5:
            hyp, ref = "only hyp", ""  # empty ref
        elif kind == 6:
            hyp = "  " + "   ".join(words) + "\t "  # spacing the reader and jiwer drop
        elif kind == 7:
            hyp = ref.upper()
        else:
            hyp = ref[::-1]
        refs.append((f"utt{i:05d}", ref))
        hyps.append((f"utt{i:05d}", hyp))
    return refs, hyps


def write_scp(path: Path, rows, *, blank_every: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for i, (utt, value) in enumerate(rows):
            out.write(f"{utt} {value}\n" if value else (f"{utt}\n" if i % 2 else f"{utt} \n"))
            if blank_every and i % blank_every == blank_every - 1:
                out.write("\n   \n")


def build_inference_dir(root: Path) -> Path:
    """Four test sets (errors, empty hyps, non-ASCII, > 1000 utterances) and a hidden folder."""
    out = root / "inference"
    write_scp(out / "errors" / "ref.scp", [("e1", "a b c"), ("e2", "d e f g"), ("e3", "h"), ("e4", "same here")])
    write_scp(out / "errors" / "hyp.scp", [("e1", "a x c"), ("e2", "d f g"), ("e3", "h i j"), ("e4", "same here")])
    write_scp(out / "empty_hyps" / "ref.scp", [("m1", "one two"), ("m2", "three"), ("m3", "four five six")])
    write_scp(out / "empty_hyps" / "hyp.scp", [("m1", ""), ("m2", ""), ("m3", "four")])
    write_scp(
        out / "non_ascii" / "ref.scp",
        [("n1", "こんにちは 世界"), ("n2", "Grüße aus Köln"), ("n3", "안녕 하세요 123"), ("n4", "emoji 🎉 ok")],
    )
    write_scp(
        out / "non_ascii" / "hyp.scp",
        [("n1", "こんにちわ 世界"), ("n2", "Grüsse aus Köln"), ("n3", "안녕 하세요"), ("n4", "emoji 🎉🎉 ok")],
    )
    refs, hyps = many_rows(2345)
    write_scp(out / "big" / "ref.scp", refs, blank_every=97)
    write_scp(out / "big" / "hyp.scp", hyps)
    (out / ".hidden").mkdir()
    return out


class ParityDataset:
    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return dict(self.rows[idx])


class ParityOrganizer:
    """``test: [{name, n}]``: n items ``{utt_id, text, speech}`` whose text is the reference."""

    def __init__(self, test=(), **_: Any):
        self.test = {}
        for entry in test:
            refs, _hyps = many_rows(int(entry["n"]))
            self.test[entry["name"]] = ParityDataset(
                [{"utt_id": utt, "text": text, "n_words": len(text.split())} for utt, text in refs]
            )


def write_dataset_hyps(inference_dir: Path, tests: dict[str, int]) -> None:
    """What infer would write for ParityOrganizer: ``<test>/text.scp`` (hyps only, no refs)."""
    for name, n in tests.items():
        _refs, hyps = many_rows(n)
        write_scp(inference_dir / name / "text.scp", hyps)


class WordStats(BaseMetric):
    """A custom metric on ESPnet3's BaseMetric API: sum and cat states, an artifact file."""

    inputs = (Field("hyp", "text"), Field("ref", "text", optional=True))
    outputs = (Field("hyp_words", "number"), Field("mean_len", "number"), Field("chunks", "number"))

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.add_state("hyp_words", 0, "sum")
        self.add_state("chunks", 0, "sum")
        self.add_state("lengths", [], "cat")

    def update(self, *, hyp, ref=None):
        self.chunks += 1
        self.hyp_words += sum(len(h.split()) for h in hyp)
        self.lengths.extend(len(h) for h in hyp)

    def compute(self):
        mean = sum(self.lengths) / len(self.lengths) if self.lengths else 0.0
        return {"hyp_words": self.hyp_words, "mean_len": round(self.scale * mean, 4), "chunks": self.chunks}

    def write_artifacts(self, test_dir: Path) -> None:
        (test_dir / "word_stats.txt").write_text(" ".join(map(str, self.lengths[:50])) + "\n", encoding="utf-8")


class ColumnDataset:
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, idx):
        return self.rows[idx]


class ColumnOrganizer:
    """Test sets that exercise dataset: columns (ids, missing columns, line breaks, objects)."""

    builds = 0

    def __init__(self, test=()):
        ColumnOrganizer.builds += 1
        rows = {
            "dev": [
                {"utt_id": "d1", "text": "héllo wörld", "n": 2, "ok": True},
                {"utt_id": "d2", "text": "", "n": 0, "ok": False},
            ],
            "noid": [{"text": "a"}, {"text": "b"}],
            "badid": [{"utt_id": "a b", "text": "x"}],
            "multiline": [{"utt_id": "m1", "text": "one\ntwo"}],
            "array": [{"utt_id": "r1", "text": object()}],
        }
        self.test = {t["name"]: ColumnDataset(rows[t["name"]]) for t in test}


def _load(path: str, overrides: list[str]):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    OmegaConf.resolve(cfg)
    return cfg


def espnet3_prefect_file() -> str:
    import espnet3_prefect

    return espnet3_prefect.__file__


def _this_checkouts_flows(root: Path) -> None:
    """Map ``espnet3_prefect.flows``/``.tasks`` to this checkout's folders (an editable install of
    another checkout would otherwise serve them: they live outside the package folder)."""
    import importlib.util

    import espnet3_prefect

    for name in ("flows", "tasks"):
        full = f"espnet3_prefect.{name}"
        spec = importlib.util.spec_from_file_location(
            full, root / name / "__init__.py", submodule_search_locations=[str(root / name)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(espnet3_prefect, name, module)


def main(argv: list[str]) -> int:
    mode, metrics_path, *rest = argv
    inference_path = None
    if "--inference-config" in rest:
        at = rest.index("--inference-config")
        inference_path = rest[at + 1]
        rest = rest[:at] + rest[at + 2 :]
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    if mode == "measure":
        from espnet3.systems.base.metric import measure

        measure(_load(metrics_path, rest), inference_config=_load(inference_path, []) if inference_path else None)
        return 0
    if mode == "ours":
        _this_checkouts_flows(Path(root))
        import espnet3_prefect.flows.metrics as flow_module

        print(f"espnet3_prefect from {espnet3_prefect_file()}, flow from {flow_module.__file__}", file=sys.stderr)
        metrics = flow_module.metrics
        metrics(config=[metrics_path], overrides=rest, inference_config=[inference_path] if inference_path else None)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
