"""Prefect tasks, one file per step: build_env, run_shard, mark_done, merge (infer); score (metrics)."""
