"""Per corpus: the job that evaluates one embedder partition, the schedule that re-evaluates every
embedder that can run here, and the sensor that refreshes the corpus's reports after an evaluation.
The fixture corpus keeps the bare names (``evaluate_embedders``); another corpus's carry ``__<name>``."""

import dagster as dg

from retrieval_assets import partitions
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.corpus import CORPUS_TAG
from retrieval_assets.defs.partitions import embedders, group, key
from retrieval_assets.defs.remote import SERVER_TAG


def corpus_jobs(corpus: Corpus, server: str = "") -> dg.Definitions:
    """``evaluate_embedders``, ``refresh_reports``, ``nightly_evaluation`` and ``reports_after_evaluation`` of ``corpus``;
    ``server``: the Postgres their runs use, as a tag each step checks (``defs/remote.py``)."""
    tags = {CORPUS_TAG: corpus.name, **({SERVER_TAG: server} if server else {})}
    selection = dg.AssetSelection.groups(group(corpus))
    if not corpus.is_fixture:  # its golden_drafts writes the draft the user reviews: materialised when asked for, not nightly
        selection -= dg.AssetSelection.assets(key(corpus, "golden_drafts"))
    evaluate = dg.define_asset_job(
        partitions.job_name("evaluate_embedders", corpus.name), selection=selection, tags=tags,
        description=f"Corpus {corpus.name}: index and evaluate one embedder partition, then write the failure report and "
        "refresh the comparison.",
    )
    refresh = dg.define_asset_job(
        partitions.job_name("refresh_reports", corpus.name), selection=dg.AssetSelection.groups(group(corpus, "reports")), tags=tags,
        description=f"Corpus {corpus.name}: refresh eval_trend from the eval_runs history.",
    )

    @dg.schedule(name=partitions.job_name("nightly_evaluation", corpus.name), job=evaluate, cron_schedule="0 3 * * *",
                 default_status=dg.DefaultScheduleStatus.STOPPED,
                 description=f"Nightly, corpus {corpus.name}: one run per embedder partition whose model files are on this machine "
                 "(the others are not requested, so no run or check of theirs reads as failed).")
    def nightly_evaluation(context: dg.ScheduleEvaluationContext):
        runnable, skipped = [], {}
        for partition in embedders.get_partition_keys():
            reason = partitions.get(partition).missing()
            if reason is None:
                runnable.append(partition)
            else:
                skipped[partition] = reason
        for partition, reason in skipped.items():
            context.log.info(f"not scheduled: partition {partition}: {reason}")
        if not runnable:
            return dg.SkipReason("no embedder can run here: " + "; ".join(f"{k}: {r}" for k, r in skipped.items()))
        return [dg.RunRequest(run_key=f"{corpus.name}-{p}-{context.scheduled_execution_time:%Y%m%d}", partition_key=p, tags=tags)
                for p in runnable]

    @dg.asset_sensor(asset_key=key(corpus, "eval_run"), name=partitions.job_name("reports_after_evaluation", corpus.name), job=refresh,
                     default_status=dg.DefaultSensorStatus.RUNNING,
                     description=f"With the daemon running, refresh corpus {corpus.name}'s eval_trend after any of its eval_runs.")
    def reports_after_evaluation(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
        """One refresh per eval_run materialisation seen (the latest, when several landed between ticks; the
        cursor is the latest event seen, so one that lands while a refresh runs gets a refresh of its own).
        An automation condition (any_deps_updated().since_last_handled()) lost such an update: it resets on
        the tick after a request, and the nightly tick's second partition finished in that window."""
        return dg.RunRequest(run_key=f"eval_run-{asset_event.run_id or 'runless'}-{asset_event.timestamp}", tags=tags)

    return dg.Definitions(jobs=[evaluate, refresh], schedules=[nightly_evaluation], sensors=[reports_after_evaluation])
