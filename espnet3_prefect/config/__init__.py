"""Config in, before anything runs: ESPnet3 YAML merged and validated (``load``), misspelt top-level keys
(``keys``), a recipe loaded as its launcher loads it (``recipe_configs``), ``_target_`` resolution (``targets``), the
``runner:`` keys that steer the orchestration (``runner_keys``) and the driver-side checks (``precheck``)."""
