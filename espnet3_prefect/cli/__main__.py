"""``python -m espnet3_prefect.cli`` is the ``espnet3-prefect`` command (its code under the main guard:
local Dask workers and the fork server re-import the main module, as any multiprocessing program's)."""

import sys

from espnet3_prefect.cli import main

if __name__ == "__main__":
    sys.exit(main())
