"""The ESPnet3 202611 classes, standalone: what a recipe subclasses or names in its config.

``runner`` (``BaseRunner``), ``inference_runner`` (``InferenceRunner``), ``provider`` (``EnvironmentProvider``,
``InferenceProvider``), the inference ``contract`` (over ``contract_kinds``),
``audio`` (``Audio``), ``artifacts`` (non-scalar outputs as files) and ``envcall`` (env entries passed by name).
With espnet3 installed, its own classes are used (:mod:`espnet3_prefect.config.targets`)."""
