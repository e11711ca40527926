"""`python -m spatialfed ...`: the `spatialfed` command line."""

import sys

from spatialfed.cli import main

sys.exit(main())
