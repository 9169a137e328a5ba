"""``python -m cli``: the same as the ``ibex`` console script."""

import sys

from cli import entry

sys.exit(entry())
