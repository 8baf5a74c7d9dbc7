"""``python -m ebrl.tracking``: see :mod:`ebrl.tracking.replay`."""

from ebrl.tracking.replay import main

raise SystemExit(main())
