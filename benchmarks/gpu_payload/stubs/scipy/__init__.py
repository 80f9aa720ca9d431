"""Stand-in for scipy in the GPU payload: importable, every use raises (ASR decoding uses none)."""


class Missing:
    def __init__(self, name):
        self.name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise NotImplementedError(f"{self.name}.{attr}: scipy is not in the GPU payload (stub)")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.name}: scipy is not in the GPU payload (stub)")
