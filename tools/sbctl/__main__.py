"""python -m sbctl."""

import sys

from sbctl.cli import main

sys.exit(main())
