"""Config in, before anything runs: ESPnet3 YAML merged and validated (``load``), misspelt top-level keys
(``keys``), a recipe loaded as its launcher loads it (``recipe_configs``), ``_target_`` resolution (``targets``), the
``runner:`` keys that steer the orchestration (``runner_keys``). Above the ground floor (``disk``) only:
the driver-side checks that build datasets are the pipeline's (:mod:`espnet3_prefect.pipeline.precheck`)."""
