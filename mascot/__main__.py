"""``python -m mascot``: the command line (also ``accelerate launch -m mascot ...``)."""

import sys

from mascot.cli import main

sys.exit(main())
