"""``python -m pytest_gpucolloc.cli``: the same as the ``pytest-gpucolloc`` command."""
import sys

from . import main

sys.exit(main())
