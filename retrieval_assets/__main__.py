"""``python -m retrieval_assets <command>``: see ``retrieval_assets.cli``."""

from retrieval_assets.cli import main

raise SystemExit(main())
