"""``python -m lab``: run commands in the lab kernel, build a cluster topology, serve the API."""

from lab.cli import main

raise SystemExit(main())
