"""``python -m lab.cluster.upstream``: build the lab's upstream components not cached yet."""

from lab.cluster.upstream import main

raise SystemExit(main())
