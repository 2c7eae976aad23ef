"""``python -m bench.chaos`` (from the repository root): see bench/chaos/__init__.py."""

from __future__ import annotations

import sys

from bench.chaos.cli import main

sys.exit(main())
