"""FSDD (Free Spoken Digit Dataset) for the F5-TTS recipe: builder and dataset."""

from .fsdd import FsddBuilder as DatasetBuilder
from .fsdd import FsddDataset as Dataset

__all__ = ["Dataset", "DatasetBuilder"]
