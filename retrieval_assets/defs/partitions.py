"""The graph's two dimensions as Dagster sees them: the embedder partitions (from
``retrieval_assets.partitions``) and the corpus, which keys every asset, group and job name."""

import warnings

import dagster as dg

from retrieval_assets import partitions
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.partitions import PARTITIONS


class EmbedderPartitions(dg.StaticPartitionsDefinition):
    """The embedder partitions; an unknown key is refused with the sentence the command line gives for it
    (``partitions.unknown``: it lists the valid keys) before a run is created; Dagster's own says only
    "Could not find a partition with key"."""

    def validate_partition_key(self, partition_key: str, context) -> None:
        if not self.has_partition_key(partition_key):
            raise dg.DagsterUnknownPartitionError(partitions.unknown(partition_key))


embedders = EmbedderPartitions(list(PARTITIONS))

# The checks of chunk_index and eval_run are evaluated per embedder partition (AssetCheckSpec.partitions_def),
# which Dagster 1.13 marks as a preview; we rely on it knowingly and keep the console quiet.
warnings.filterwarnings("ignore", message=".*partitions_def on an AssetCheckSpec", category=dg.PreviewWarning)


def key(corpus: Corpus, name: str) -> dg.AssetKey:
    """The asset ``name`` of ``corpus``: ``fixture/eval_run``, ``handbook/eval_run``."""
    return dg.AssetKey([corpus.name, name])


def group(corpus: Corpus, kind: str = "") -> str:
    """The corpus's group: its name for the evaluated chain, ``<name>_<kind>`` for reports, experiments, live."""
    return f"{corpus.name}_{kind}" if kind else corpus.name


def ins(corpus: Corpus, *names: str) -> dict[str, dg.AssetIn]:
    """The inputs ``names`` of an asset, read from the same corpus's assets."""
    return {name: dg.AssetIn(key(corpus, name)) for name in names}
