"""`python -m sidelinja_worker` is the `sidelinja-worker` program."""

from sidelinja_worker.cli.main import main

raise SystemExit(main())
