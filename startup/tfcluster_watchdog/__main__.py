"""`python3 <folder>/tfcluster_watchdog ...`: the watchdog's command line (loop.main)."""

import sys
from pathlib import Path

if not __package__:  # Run as a folder: its parent holds the package.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tfcluster_watchdog.loop import main  # noqa: E402 - after the path above

sys.exit(main())
