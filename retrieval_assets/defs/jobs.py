"""The whole graph as a job, a schedule that re-evaluates every embedder that can run here, and the
sensor that refreshes the reports after an evaluation."""

import dagster as dg

from retrieval_assets import partitions
from retrieval_assets.defs.partitions import embedders

evaluate_embedders = dg.define_asset_job(
    "evaluate_embedders",
    selection=dg.AssetSelection.groups("retrieval"),
    description="Index and evaluate one embedder partition, then write the failure report and refresh the comparison.",
)


@dg.schedule(job=evaluate_embedders, cron_schedule="0 3 * * *", default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Nightly: one run per embedder partition whose model files are on this machine.")
def nightly_evaluation(context: dg.ScheduleEvaluationContext):
    runnable, skipped = [], {}
    for key in embedders.get_partition_keys():
        reason = partitions.get(key).missing()
        if reason is None:
            runnable.append(key)
        else:
            skipped[key] = reason
    for key, reason in skipped.items():
        context.log.info(f"not scheduled: partition {key}: {reason}")
    if not runnable:
        return dg.SkipReason("no embedder can run here: " + "; ".join(f"{k}: {r}" for k, r in skipped.items()))
    return [dg.RunRequest(run_key=f"{key}-{context.scheduled_execution_time:%Y%m%d}", partition_key=key) for key in runnable]


refresh_reports = dg.define_asset_job(
    "refresh_reports", selection=dg.AssetSelection.groups("reports"),
    description="Refresh eval_trend from the eval_runs history (the reports group).",
)


@dg.asset_sensor(asset_key=dg.AssetKey("eval_run"), name="reports_after_evaluation", job=refresh_reports,
                 default_status=dg.DefaultSensorStatus.RUNNING,
                 description="With the daemon running (dagster dev, or the daemon alone), refresh eval_trend after any eval_run.")
def reports_after_evaluation(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
    """One refresh per eval_run materialisation seen (the latest, when several landed between ticks; the
    cursor is the latest event seen, so one that lands while a refresh runs gets a refresh of its own).
    An automation condition (any_deps_updated().since_last_handled()) lost such an update: it resets on
    the tick after a request, and the nightly tick's second partition finished in that window."""
    return dg.RunRequest(run_key=f"eval_run-{asset_event.run_id or 'runless'}-{asset_event.timestamp}")
