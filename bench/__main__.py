"""`python -m bench ...`: see bench/harness.py."""

import signal
import sys

from bench.harness import main

# SIGTERM (a timeout's kill) unwinds like Ctrl-C, so compile-timing children die too.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
sys.exit(main())
