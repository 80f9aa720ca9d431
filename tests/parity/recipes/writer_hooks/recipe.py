"""Case (b): a runner with its own writer hooks, in the style of ESPnet3's ``MyTextRunner`` example
(a ``BaseRunner`` whose shards write ``text`` and whose ``merge`` joins them).

Two changes from the documented example, both needed for upstream ``infer()`` to accept it:
``infer()`` constructs the runner with ``idx_key``/``hyp_key``/``ref_key`` and requires an
``idx_key`` attribute (espnet3/systems/base/inference.py, the ``runner_kwargs`` and the
``hasattr(runner, "idx_key")`` check), and it requires ``runner(...) is True`` while
``BaseRunner.__call__`` returns what ``merge`` returns (``{}`` here). ``close_writers`` takes
``(writers, state, **env)``, which is how ``BaseRunner.finalize_state`` calls it.
"""

from __future__ import annotations

from pathlib import Path

from ..compat import BaseRunner


class MyTextRunner(BaseRunner):
    def __init__(self, provider, idx_key="utt_id", hyp_key=None, ref_key=None, **kwargs):
        super().__init__(provider, **kwargs)
        self.idx_key = idx_key

    @staticmethod
    def forward(idx, dataset, model, **env):
        sample = dataset[idx]
        hyp = model(sample["speech"])
        return {"utt_id": sample["utt_id"], "text": hyp}

    @staticmethod
    def open_writers(shard_dir: Path, **env):
        return {"text": (shard_dir / "text").open("w", encoding="utf-8")}

    @staticmethod
    def write_record(writers, result, state, **env):
        writers["text"].write(f"{result['utt_id']} {result['text']}\n")

    @staticmethod
    def close_writers(writers, state, **env):
        for handle in writers.values():
            handle.close()
        return None

    def merge(self, shard_dirs):
        out_dir = self.output_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / "text").open("w", encoding="utf-8") as out:
            for shard_dir in sorted(shard_dirs):
                path = shard_dir / "text"
                if path.exists():
                    out.write(path.read_text(encoding="utf-8"))
        return {}

    def __call__(self, indices):
        super().__call__(indices)
        return True
