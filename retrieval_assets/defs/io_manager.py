"""Asset values in Postgres, so the steps of a run need not share a disk.

Contract: ``PostgresPickleIOManager`` stores each asset output as one pickle (protocol 5) in
``<io_schema>.asset_values`` (``retrieval_io`` after the resource's schema prefix), one row per
asset key ("/"-joined, so the corpus is part of it: ``handbook/chunks``), asset partition (''
for an unpartitioned asset, also when it runs inside a partitioned run) and the run that
produced it. An input produced in the same run (or, in a re-execution, in the parent run whose
step it reuses) is read from that run's row; an input from outside the run from the row of the
run that Dagster's event log records as its latest materialisation (the newest row when the log
has none): two runs at once never read each other's values. A key's rows older than a day are
pruned when a new one is written, the newest ``KEEP`` always kept. Every value it is handed is
stored, ``None`` included: ``eval_run`` and ``failure_report`` yield ``Output(None)`` for a
corpus without a golden set, and their downstreams read that ``None``. Dagster does not call an
IO manager for assets that return ``MaterializeResult`` or are annotated ``-> None``, so those
have no row. Loading an unpartitioned upstream, or one partition of a partitioned one, returns
the value; several partitions come back as ``{partition: value}``. A missing row is a
``dg.Failure`` naming the asset and partition. The schema and table are created on the first
write. The values are pickles: only this project's runs write the table, and a reader needs the
same classes. ``io_managers()`` registers it as ``io_manager`` for every asset of the defs folder.
"""

# No ``from __future__ import annotations``: Dagster reads the ResourceDependency annotation of
# the class body, and a string annotation makes it an ordinary (rejected) pydantic field.
import pickle
from collections.abc import Sequence

import dagster as dg
import psycopg
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from retrieval_assets import partitions, pg
from retrieval_assets.defs.resources import PostgresResource, postgres_resource, user_errors

TABLE = partitions.IO_TABLE
PROTOCOL = 5
KEEP = 3  # rows kept per asset key and partition however old (re-execution of a recent run reads them)
_LOCK = "retrieval_assets.io_manager"  # the advisory lock that serialises creating the schema and table


class PostgresPickleIOManager(dg.ConfigurableIOManager):
    """Pickled asset values in ``<io_schema>.asset_values`` of the retrieval Postgres."""

    postgres: dg.ResourceDependency[PostgresResource]

    @property
    def table_name(self) -> str:
        return f"{self.postgres.io_schema}.{TABLE}"

    def _table(self) -> sql.Identifier:
        return sql.Identifier(self.postgres.io_schema, TABLE)

    def ensure_table(self, conn: psycopg.Connection) -> None:
        """Create the schema and table if missing, and key a table of an older version by run too;
        safe when several steps do it at once."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_LOCK,))
            pg.ensure_schema(conn, self.postgres.io_schema)
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (asset_key text, partition text NOT NULL DEFAULT '', run_id text NOT NULL, "
                "value bytea NOT NULL, stored_at timestamptz DEFAULT now(), PRIMARY KEY (asset_key, partition, run_id))"
            ).format(self._table()))
            if not conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                                "AND column_name = 'run_id'", (self.postgres.io_schema, TABLE)).fetchone():
                # a table keyed by (asset_key, partition) alone: its rows belong to no known run
                conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN run_id text NOT NULL DEFAULT ''").format(self._table()))
                conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                    self._table(), sql.Identifier(f"{TABLE}_pkey")))
                conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (asset_key, partition, run_id)").format(self._table()))

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        key = _key(context)
        if context.has_asset_partitions:
            partition_keys = context.asset_partition_keys
            if len(partition_keys) != 1:
                raise dg.Failure(f"{type(self).__name__} stores one partition per output, but asset {key} was given "
                                 f"{len(partition_keys)}: launch the backfill as one run per partition")
            partition = partition_keys[0]
        else:
            partition = ""
        data = pickle.dumps(obj, protocol=PROTOCOL)
        upsert = sql.SQL(
            "INSERT INTO {} (asset_key, partition, run_id, value) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (asset_key, partition, run_id) DO UPDATE SET value = EXCLUDED.value, stored_at = now()"
        ).format(self._table())
        prune = sql.SQL(
            "DELETE FROM {0} WHERE asset_key = %s AND partition = %s AND stored_at < now() - interval '1 day' AND run_id NOT IN "
            "(SELECT run_id FROM {0} WHERE asset_key = %s AND partition = %s ORDER BY stored_at DESC LIMIT %s)"
        ).format(self._table())
        row = (key, partition, context.run_id, data)
        with user_errors(f"storing {key}"), self.postgres.connect() as conn:
            try:
                conn.execute(upsert, row)
            except (errors.UndefinedTable, errors.InvalidSchemaName, errors.UndefinedColumn):
                self.ensure_table(conn)
                conn.execute(upsert, row)
            conn.execute(prune, (key, partition, key, partition, KEEP))
        context.add_output_metadata({"value_table": self.table_name, "value_bytes": len(data)})

    def load_input(self, context: dg.InputContext) -> object:
        key = _key(context)
        if not context.has_asset_key or not context.has_asset_partitions:
            return self._load(context, key, [""])[""]
        partition_keys = list(context.asset_partition_keys)
        values = self._load(context, key, partition_keys)
        if len(partition_keys) == 1:
            return values[partition_keys[0]]
        return values

    def _producers(self, context: dg.InputContext, partition_keys: Sequence[str]) -> dict[str, str | None]:
        """Per partition, the run whose value to read: the producing step's run when that run materialised
        the partition (this run, or the parent a re-execution reuses), else the latest materialisation in
        the event log (None: none recorded): at most three queries of the event log however many partitions."""
        producer = None
        try:
            producer = context.upstream_output.run_id if context.upstream_output is not None else None
        except dg.DagsterInvariantViolationError:  # an asset from outside the run: its context carries no run
            pass
        here = set()
        if producer:  # Dagster's placeholder id for an asset from outside the run has no events
            events = context.instance.get_records_for_run(producer, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
            here = {r.event_log_entry.dagster_event.partition or "" for r in events
                    if r.event_log_entry.dagster_event.asset_key == context.asset_key}
        runs: dict[str, str | None] = {p: producer for p in partition_keys if p in here}
        rest = [p for p in partition_keys if p not in here]
        if rest == [""]:  # unpartitioned: its latest materialisation
            records = context.instance.fetch_materializations(context.asset_key, limit=1).records
            runs[""] = records[0].run_id if records else None
        elif rest:  # the latest materialisation of every partition, then their runs
            latest = context.instance.get_latest_storage_id_by_partition(
                context.asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(rest))
            records = context.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=context.asset_key, storage_ids=list(latest.values())),
                limit=len(latest)).records if latest else []
            by_id = {r.storage_id: r.run_id for r in records}
            runs.update({p: by_id.get(latest[p]) if p in latest else None for p in rest})
        return {p: runs.get(p) for p in partition_keys}

    def _load(self, context: dg.InputContext, key: str, partition_keys: Sequence[str]) -> dict[str, object]:
        """The values of ``key`` for ``partition_keys``, in that order; a ``dg.Failure`` for a missing one
        (skipped instead when the input's metadata sets ``allow_missing_partitions``, as for UPathIOManager)."""
        if not partition_keys:
            return {}
        producers = self._producers(context, partition_keys) if context.has_asset_key else {p: None for p in partition_keys}
        query = sql.SQL(
            "SELECT DISTINCT ON (partition) partition, value FROM {} WHERE asset_key = %s AND partition = ANY(%s) "
            "AND (run_id = (%s::jsonb ->> partition) OR (%s::jsonb ->> partition) IS NULL) ORDER BY partition, stored_at DESC"
        ).format(self._table())
        wanted = Jsonb({p: r for p, r in producers.items() if r})
        with user_errors(f"loading {key}"), self.postgres.connect() as conn:
            try:
                rows = dict(conn.execute(query, (key, list(partition_keys), wanted, wanted)).fetchall())
            except (errors.UndefinedTable, errors.InvalidSchemaName, errors.UndefinedColumn):
                rows = {}
        missing = [p for p in partition_keys if p not in rows]
        where_run = {p: producers[p] for p in missing if producers[p]}
        allow_missing = bool((context.definition_metadata or {}).get("allow_missing_partitions", False)) and len(partition_keys) > 1
        if missing and not allow_missing:
            where = "partition " + ", ".join(missing) if missing != [""] else "(unpartitioned)"
            runs = f" of run {', '.join(sorted(set(where_run.values())))}" if where_run else ""
            raise dg.Failure(
                f"no stored value for asset {key} {where}{runs}: materialize it first (looked in {self.table_name})",
                metadata={"asset_key": key, "missing_partitions": ", ".join(missing) or "(unpartitioned)", "table": self.table_name},
            )
        for p in missing:
            context.log.warning(f"no stored value for asset {key} partition {p}: skipped (allow_missing_partitions)")
        return {p: pickle.loads(rows[p]) for p in partition_keys if p in rows}


def _key(context: dg.InputContext | dg.OutputContext) -> str:
    """The row key: the asset key's path joined by "/", or ``ops/<run>/<step>/<output>`` for a plain op output."""
    if context.has_asset_key:
        return "/".join(context.asset_key.path)
    return "/".join(["ops", *context.get_identifier()])


@dg.definitions
def io_managers() -> dg.Definitions:
    # The same Postgres as the "postgres" resource; a nested resource is given by value, not by key.
    return dg.Definitions(resources={"io_manager": PostgresPickleIOManager(postgres=postgres_resource())})
