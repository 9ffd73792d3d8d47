"""The Dagster layer: assets, checks, resources, jobs and schedules that wire the pipeline modules."""
