"""Stand-in for librosa in the GPU payload: only ``filters.mel`` (the frontend's filter bank)."""

from librosa import filters  # noqa: F401


def __getattr__(name):
    raise NotImplementedError(f"librosa.{name}: librosa is not in the GPU payload (stub)")
