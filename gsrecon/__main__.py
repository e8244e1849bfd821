"""``python -m gsrecon``: the command line."""

import sys

from gsrecon.cli import entry_point

sys.exit(entry_point())
