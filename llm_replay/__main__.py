"""`python -m llm_replay ...`: the console script without its installed launcher."""

import sys

from llm_replay.entry import main

sys.exit(main())
