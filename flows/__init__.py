"""Prefect flows: infer (and later metrics, evaluate)."""
