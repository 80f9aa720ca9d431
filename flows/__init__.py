"""Prefect flows: infer, metrics, evaluate (infer then metrics, with a score history)."""
