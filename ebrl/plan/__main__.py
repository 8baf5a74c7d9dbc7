"""``python -m ebrl.plan``: see :mod:`ebrl.plan.cli`."""

import sys

from ebrl.plan.cli import main

sys.exit(main())
