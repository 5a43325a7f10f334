"""`python -m atoll.parent server|site KIT`: a parent's own process (run.py)."""

import sys

from atoll.parent.run import main

main(sys.argv[1:])
