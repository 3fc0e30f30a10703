"""src/honed/cli/__main__.py: `python -m honed.cli` runs the `honed` command line."""

import sys

from honed.cli import main

sys.exit(main())
