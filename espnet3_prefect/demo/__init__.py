"""Self-contained demo recipes (synthetic data + small real models, no downloads)."""
