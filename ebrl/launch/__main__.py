"""``python -m ebrl.launch``: see :mod:`ebrl.launch.cli`."""

import sys

from ebrl.launch.cli import main

sys.exit(main())
