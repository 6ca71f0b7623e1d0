"""`python -m sim.cli ...` runs `ppsim ...`."""

import sys

from sim.cli import main

sys.exit(main())
