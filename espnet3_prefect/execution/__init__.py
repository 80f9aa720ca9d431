"""Where the tasks run: the validated ``parallel`` block (``spec``), the block registered for a process
(``process_parallel``), prefect-dask's task runner with cheap submission, gated on the tested Prefect
releases (``task_runner``), the cluster around a flow (``cluster``), the worker side (``worker_api``),
run folders (``rundir``), run states Prefect cannot see (``run_states``), and one module per scheduler
family under ``backends``."""
