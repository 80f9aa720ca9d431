"""The recipe as one run: ESPnet3's stages in its order, each done (Cached) or run between two records.

``launcher`` (a run built by ESPnet3's own launcher), ``driver`` (the stage loop), ``rule`` (when a
stage is done), ``record`` (``<stage>.stage.json``), ``outputs`` (which files, their manifest),
``resume`` (``train`` from its last checkpoint), ``table`` (what each stage reads and writes),
``system`` (the stages a system declares). Prefect appears only in ``flows/recipe.py``.
"""
