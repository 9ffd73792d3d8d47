"""``python -m retrieval_assets.pg [dsn|settings|stop]``: see ``retrieval_assets.pg.command``."""

from retrieval_assets.pg.command import main

raise SystemExit(main())
