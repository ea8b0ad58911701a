"""Run the worker command line: `python -m workers` equals `deployhub-worker`."""

import sys

from workers.cli import main

sys.exit(main())
