"""python -m ostinato.server == ostinato-serve."""

import sys

from .cli import main

sys.exit(main())
