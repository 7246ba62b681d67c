"""``python -m hpcmem`` is the ``hpcmem`` command."""

import sys

from hpcmem.cli import main

sys.exit(main())
