"""``python -m ssm_cli``: the ``ssm-scan`` command, for an environment whose scripts are not on PATH."""

import sys

from .main import main

sys.exit(main())
