"""The GPU's busy share while a shard runs, sampled through NVML (``nvidia-ml-py``, optional: the
``gpu`` extras install it) in a background thread of the worker: the share of samples in which the
device ran a kernel (NVML's utilisation counter, itself an average over its own sample period).

No GPU, no NVML library or no ``pynvml`` module: nothing is sampled and the shard's summary has no
``gpu_busy`` (the report then says nothing of the GPU). The device is the one this worker's CUDA
context is on (torch's current device where torch has CUDA up), else the first one the worker sees.

>>> with GpuBusy(enabled=False) as gpu:
...     pass
>>> gpu.result() is None
True
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

#: seconds between two samples (NVML updates its counter every 1/6 s to 1 s, by device)
SAMPLE_EVERY_S = 0.1


#: set once NVML is known to be absent in this process (no module, no library): never looked for again
_ABSENT: list[bool] = []


def _nvml() -> Any:
    if _ABSENT:
        return None
    try:
        import pynvml
    except ImportError:
        _ABSENT.append(True)
        return None
    return pynvml


def _device_index() -> int:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            index = cuda.current_device()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            if visible and visible[0].strip().isdigit() and index < len(visible):
                return int(visible[index])  # NVML counts every device, not the visible ones
            return index
    except Exception:  # noqa: BLE001 - fall back to the first visible device
        pass
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


class GpuBusy:
    """Context manager sampling the GPU's busy share in a thread; :meth:`result` afterwards."""

    def __init__(self, enabled: bool = True, every_s: float = SAMPLE_EVERY_S):
        self.enabled, self.every_s = enabled, every_s
        self.samples: list[float] = []
        self.device: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def __enter__(self) -> GpuBusy:
        if not self.enabled or os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
            return self
        nvml = _nvml()
        if nvml is None:
            return self
        try:
            nvml.nvmlInit()
        except Exception:  # noqa: BLE001 - no driver, no library: no GPU to sample, now or later
            _ABSENT.append(True)
            return self
        try:
            self.device = _device_index()
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.device)
        except Exception:  # noqa: BLE001
            self._shutdown(nvml)
            return self
        self._nvml = nvml
        self._thread = threading.Thread(target=self._sample, name="e3p-gpu-busy", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while True:
            try:
                self.samples.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu) / 100.0)
            except Exception:  # noqa: BLE001 - a device that stops answering ends the sampling
                return
            if self._stop.wait(self.every_s):
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._shutdown(self._nvml)

    @staticmethod
    def _shutdown(nvml: Any) -> None:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass

    def result(self) -> dict[str, Any] | None:
        """``{"device", "samples", "busy"}`` (mean busy share, 0..1), or None when nothing was sampled."""
        if not self.samples:
            return None
        return {
            "device": self.device,
            "samples": len(self.samples),
            "busy": round(sum(self.samples) / len(self.samples), 4),
        }
