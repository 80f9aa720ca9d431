"""Prefect tasks, one file per step: build_env, run_shard (marks each shard done), merge (infer); score (metrics)."""
