"""`python -m replay.cli ...`: the console script without its installed launcher."""

import sys

from replay.cli.entry import main

sys.exit(main())
