"""Small helpers the rest of the package shares: value checks and JSON (``util``), child processes
(``proc``), atomic writes (``atomic``), the SCP text format (``scp``), a dependency-free PNG chart (``png``)."""
