"""`python -m sidelinja_worker` is the `sidelinja-worker` program."""

from sidelinja_worker.cli import main

raise SystemExit(main())
