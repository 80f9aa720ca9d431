"""Parity layer: our outputs against the real ESPnet3 202611 ``infer()``/``measure()`` (issue 10).

``recipes/`` holds small recipes of our own, ``oracle.py`` runs upstream on them inside
``.venv-parity`` (``scripts/parity_setup.sh``), ``test_parity.py`` compares. Run with
``bash scripts/parity_setup.sh && bash scripts/test.sh -m parity``.
"""
