"""``python -m gsrecon``: the command line."""

import sys

from gsrecon.cli import main

sys.exit(main())
