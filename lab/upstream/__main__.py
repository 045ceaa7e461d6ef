"""``python -m lab.upstream``: build the lab's upstream components that are not cached yet."""

from lab.upstream import main

raise SystemExit(main())
