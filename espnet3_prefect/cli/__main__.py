"""``python -m espnet3_prefect.cli`` is the ``espnet3-prefect`` command."""

import sys

from . import main

sys.exit(main())
