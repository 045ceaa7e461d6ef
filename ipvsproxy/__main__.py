"""Allow ``python -m ipvsproxy``."""

from ipvsproxy.cli import main

raise SystemExit(main())
