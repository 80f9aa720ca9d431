"""The base classes a parity recipe subclasses: ESPnet3's when importable, else ours.

So one recipe module runs unchanged in both venvs: in ``.venv-parity`` (espnet 202611 on
sys.path) the recipe classes are real ESPnet3 subclasses, as a user's are; in ``.venv`` they
subclass espnet3-prefect's mirrors.
"""

from __future__ import annotations

try:
    from espnet3.parallel.base_runner import BaseRunner
    from espnet3.parallel.env_provider import EnvironmentProvider
    from espnet3.systems.base.inference_provider import InferenceProvider
    from espnet3.systems.base.inference_runner import InferenceRunner

    HAVE_ESPNET3 = True
except ImportError:
    from espnet3_prefect import BaseRunner, EnvironmentProvider, InferenceProvider, InferenceRunner

    HAVE_ESPNET3 = False

BASE = "espnet3" if HAVE_ESPNET3 else "espnet3_prefect"

__all__ = ["BASE", "HAVE_ESPNET3", "BaseRunner", "EnvironmentProvider", "InferenceProvider", "InferenceRunner"]
