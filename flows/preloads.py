"""What the fork server of this machine's local workers imports, per flow (``env: local`` and
``local_gpu``, :mod:`espnet3_prefect.execution.backends.forkserver`). A module of its own, free of
Prefect, so that the front doors (the command line, :mod:`espnet3_prefect.entry`) can start the fork
server before they import a flow (:func:`espnet3_prefect.execution.spec.start_fork_server_early`).
"""

#: what every flow's fork server imports once for all of this machine's workers
#: (``forkserver_preload=``); named, not imported: importing it runs the warm-up, which belongs in
#: the fork server only
FORKSERVER_PRELOAD = ("espnet3_prefect.tasks.forkserver_warm",)
#: the ``infer`` flow's fork server also imports torch, first (so the warm-up freezes it too): every
#: infer worker imports it anyway (the provider picks its device with it; ESPnet's models are torch),
#: ~1.7 s of CPU each, now once per machine. Not installed: Python skips it. Importing torch starts
#: no CUDA context, so forked workers may still use CUDA.
INFER_FORKSERVER_PRELOAD = ("torch", *FORKSERVER_PRELOAD)
