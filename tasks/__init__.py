"""Prefect tasks, one file per step: build_env, run_shard (marks each shard done), merge (infer); score (metrics)."""

import prefect.main  # noqa: E402,F401 - Prefect's logging set up, so its console handler exists

from espnet3_prefect.pipeline.report import quiet_console  # noqa: E402

quiet_console()  # one terminal line per shard, in every process that runs our tasks
