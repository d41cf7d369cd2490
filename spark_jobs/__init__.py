"""Spark on Tessera: the "tessera" data source, the reconciliation jobs, the audit tables.

The top of the stack (docs/design/layers.md#R1): it uses the client library and the tools.

Modules
-------
    session         the one way Tessera builds a SparkSession (Delta, quiet, small machines)
    catalog         table names: an in-memory catalog per session rebuilt from the warehouse
    datasource      the "tessera" PySpark DataSource: one partition per tablet, reads and writes
    stream_sink     `writeStream.format("tessera")`: exactly once, one transaction per micro-batch
    tables          Tessera tables created from a Spark schema or DataFrame (`create_table`)
    connect         Spark Connect: a server with Delta and the source, and a client helper
    submit          `tessera spark submit`: spark-submit with Delta, its excludes, quiet logs
    inventory       the jobs' inputs: the catalog and every tablet server's replicas
    reconcile       what the jobs find, as PURE functions of an inventory
    audit           Delta audit tables of the catalog and of job findings
    delta_log       a plain local Delta table's versions and files, read from its log (no Spark)
    demo            `make demo`: the whole product in a few minutes
    cli             `tessera jobs ...` and `tessera spark connect-server | submit`, plugged into the
                    `tessera` command (an entry point: the tools do not import spark_jobs)
    jobs/           the spark-submit jobs, one module each (jobs/__init__.py)
"""
