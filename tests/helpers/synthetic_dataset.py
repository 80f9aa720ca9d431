"""A dataset wrapper loaded under a module name no worker can import (``_e3p_synthetic_dataset``), as
ESPnet3 loads a recipe's local ``dataset/__init__.py`` (``_espnet3_local_dataset_<path>``): an object of
it that travels to a worker by pickle kills the worker as it unpickles. Loaded by
:class:`tests.helpers.toy.SyntheticModuleProvider`, never imported by its file's own name."""


class Wrapped:
    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return self.inner[index]
