"""The whole graph as a job, and a schedule that re-evaluates every embedder partition."""


import dagster as dg

from retrieval_assets.defs.partitions import embedders

evaluate_embedders = dg.define_asset_job(
    "evaluate_embedders",
    selection=dg.AssetSelection.groups("retrieval"),
    description="Index and evaluate one embedder partition, then refresh the report and the comparison.",
)


@dg.schedule(job=evaluate_embedders, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly: one run per embedder partition.")
def nightly_evaluation(context: dg.ScheduleEvaluationContext):
    for key in embedders.get_partition_keys():
        yield dg.RunRequest(run_key=f"{key}-{context.scheduled_execution_time:%Y%m%d}", partition_key=key)
