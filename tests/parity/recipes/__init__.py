"""Parity recipes: one folder per case, each an ESPnet3-shaped ``inference.yaml`` (and
``metrics.yaml`` where it scores) plus the recipe's own Python module.

| folder | case |
|---|---|
| ``stock`` | stock ``InferenceRunner`` + ``InferenceProvider``, ``output_fn`` + ``output_keys`` |
| ``writer_hooks`` | a ``BaseRunner`` with its own ``open_writers``/``write_record``/``close_writers``/``merge`` |
| ``batching`` | ``batch_size: 4`` on 13 items; the model records the batch sizes it is given |
| ``artifacts`` | ndarray / tensor / dict / custom-object outputs with ``output_artifacts`` |
| ``contract`` | ``contract:`` with ``normalize: [strip, to_lower]``, audio at its rate, ``idx_key`` attached |
| ``template`` | a config shaped like egs3/TEMPLATE/esp2_asr/conf/inference.yaml |
| ``custom_provider`` | an ``InferenceProvider`` subclass overriding ``build_dataset``/``build_model`` |
| ``hooks`` | a recorder runner that logs what every hook receives |
| ``metrics`` | WER/CER with ``dataset:text`` and with SCP-stem inputs |

Every module imports its base classes from :mod:`.compat`: the real espnet3 classes when espnet3
is importable (``.venv-parity``), ours otherwise (``.venv``). Configs name ESPnet3's stock
``_target_`` paths, which espnet3-prefect resolves to its own classes when espnet3 is absent.
"""
