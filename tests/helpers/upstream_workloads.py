"""Runner classes that subclass the real ESPnet3 202611 classes (import only where espnet3 is importable).

``UpSquares`` is a ``espnet3.parallel.base_runner.BaseRunner`` with writer hooks and a merge that
returns the merged records; ``UpProvider`` a real ``EnvironmentProvider`` whose worker setup is a
closure, as upstream recipes write them. ``up_inference_runner`` builds upstream's stock
``InferenceRunner`` over a tiny dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

from espnet3.parallel.base_runner import BaseRunner, concatenate_shard_files
from espnet3.parallel.env_provider import EnvironmentProvider
from espnet3.systems.base.inference_runner import InferenceRunner


def _items(n: int) -> list[dict]:
    return [{"utt_id": f"utt{i:03d}", "x": i, "text": f"t{i}"} for i in range(n)]


def _env(config: dict) -> dict:
    return {"dataset": _items(config["n"]), "scale": config["scale"]}


class UpProvider(EnvironmentProvider):
    def build_env_local(self):
        return _env(dict(self.config))

    def build_worker_setup_fn(self):
        config = dict(self.config)

        def setup():
            return _env(config)

        return setup


class UpSquares(BaseRunner):
    @staticmethod
    def forward(idx, dataset=None, scale=1, **env):
        rows = [{"utt_id": dataset[i]["utt_id"], "v": scale * i * i} for i in (idx if isinstance(idx, list) else [idx])]
        return rows if isinstance(idx, list) else rows[0]

    @staticmethod
    def open_writers(shard_dir, **env):
        return {"out": open(Path(shard_dir) / "part.jsonl", "w", encoding="utf-8")}

    @staticmethod
    def write_record(writers, result, state, **env):
        for row in result if isinstance(result, list) else [result]:
            writers["out"].write(json.dumps(row) + "\n")

    def merge(self, shard_dirs):
        out = Path(self.output_dir) / "all.jsonl"
        concatenate_shard_files(shard_dirs, "part.jsonl", out)
        return [json.loads(line) for line in out.read_text().splitlines()]


class UpInferProvider(EnvironmentProvider):
    def build_env_local(self):
        return {
            "dataset": _items(self.config["n"]),
            "model": _Model(),
            "input_key": "x",
            "idx_key": "utt_id",
            "output_fn_path": "tests.helpers.upstream_workloads.output_fn",
            "output_keys": ["hyp", "ref"],
        }

    def build_worker_setup_fn(self):
        provider = UpInferProvider(dict(self.config))
        return provider.build_env_local


class _Model:
    def __call__(self, x):
        return [3 * v for v in x] if isinstance(x, list) else 3 * x


def output_fn(data, model_output, idx):
    if isinstance(idx, list):
        return [output_fn(d, m, i) for d, m, i in zip(data, model_output, idx)]
    return {"utt_id": data["utt_id"], "hyp": str(model_output), "ref": data["text"]}


def up_inference_runner(n: int, output_dir, batch_size=None) -> InferenceRunner:
    return InferenceRunner(
        UpInferProvider({"n": n}),
        idx_key="utt_id",
        hyp_key="hyp",
        ref_key="ref",
        batch_size=batch_size,
        output_dir=output_dir,
    )
