"""The embedder partitions as Dagster sees them, built from ``retrieval_assets.partitions``."""

import dagster as dg

from retrieval_assets.partitions import PARTITIONS

embedders = dg.StaticPartitionsDefinition(list(PARTITIONS))
