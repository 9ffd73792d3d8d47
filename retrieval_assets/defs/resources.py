"""Postgres for the assets: ``RETRIEVAL_DSN`` when set, else the embedded default of ``pg.py``."""


import dagster as dg
import psycopg

from retrieval_assets import pg
from retrieval_assets.embed import schema_for


class PostgresResource(dg.ConfigurableResource):
    """Connections to the retrieval database; each embedder partition works in its own schema."""

    dsn: str | None = None
    schema_prefix: str = ""

    def schema(self, partition: str) -> str:
        return self.schema_prefix + schema_for(partition)

    @property
    def history_schema(self) -> str:
        return self.schema_prefix + "retrieval_history"

    def connect(self, schema: str | None = None) -> psycopg.Connection:
        return pg.connect(self.dsn, schema=schema)
