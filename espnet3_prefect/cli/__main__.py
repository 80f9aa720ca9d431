"""``python -m espnet3_prefect.cli`` is the ``espnet3-prefect`` command."""

import sys

from espnet3_prefect.cli import main

sys.exit(main())
