"""`python -m atoll.demo`: see run.py."""

import sys

from atoll.demo.run import main

sys.exit(main())
