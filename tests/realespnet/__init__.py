"""Tests against the real ESPnet 202611 mini_an4 recipe (``pytest -m realespnet``; see conftest.py)."""
