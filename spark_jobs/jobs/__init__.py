"""The spark-submit reconciliation jobs. One module per job, each with `main(argv)`:

    orphan_sweep    replicas without a catalog record, of deleted tablets, out of their config;
                    tablets without a live replica or stuck creating
    schema_audit    replicas behind their table's schema version; tables stuck ALTERING
    rebalance_plan  replica-count skew per table and per server; a saved, reviewable plan
    audit_snapshot  the catalog and the tablet servers' listings appended to Delta tables
    backup          a table's snapshot into a Delta table: full, then incremental diffs (appended)
    restore         a table recreated from any backup version of such a Delta table

Run as `spark-submit spark_jobs/jobs/<name>.py --masters ...` or `tessera jobs run <name> ...`.
The reconciliation jobs dry-run by default (`--apply` acts); exit codes 0 clean, 2 found
something, 1 error. backup and restore exit 0 done, 1 error.
Shared: `common` (arguments, inventory, reporting, exit codes) and `actions` (the fixes `--apply`
sends: admin RPCs with compare-and-set). What they find and why orphans are only reported:
spark_jobs/reconcile.py, docs/design/failover.md#R6.
"""

RECONCILIATION = ("orphan_sweep", "schema_audit", "rebalance_plan", "audit_snapshot")
"""The jobs that read the catalog and report findings (`common.run_job`)."""
JOBS = (*RECONCILIATION, "backup", "restore")
