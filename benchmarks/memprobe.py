"""Run one infer flow and print [driver peak RSS MB, max worker RSS MB] as JSON (for benchmarks.run)."""

from __future__ import annotations

import json
import resource
import threading


def _sample_workers(peak: list, stop: threading.Event) -> None:
    import psutil

    me = psutil.Process()
    while not stop.wait(0.2):
        for child in me.children(recursive=True):
            try:
                peak[0] = max(peak[0], child.memory_info().rss / 2**20)
            except psutil.Error:
                pass


def main(config_path: str) -> None:
    from espnet3_prefect.flows.infer import infer

    peak, stop = [0.0], threading.Event()
    sampler = threading.Thread(target=_sample_workers, args=(peak, stop), daemon=True)
    sampler.start()
    infer(config=[config_path])
    stop.set()
    driver_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps([driver_mb, peak[0]]))
