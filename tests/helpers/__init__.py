"""Helpers that several test modules share.

A test module never imports another test module (tests/test_test_imports.py checks it): what two
test files need alike lives here, grouped by subject, or in a `conftest.py` when a fixture is its
natural form. pytest rewrites the asserts of these modules too (tests/conftest.py registers the
package), so a helper's failing assert explains itself as a test's would.

Modules
-------
    assignment          bounded assignment rounds over a catalog env (`bounded_env`, `hashed`) and
                        the leader's background loop over a fake proxy (`background`)
    catalog_env         a catalog manager in-process over `FakeRaft`, a manual clock and a
                        TSManager (`make_env`), and the standard table it creates
    master_cluster      real master processes: stubs (`Masters`), `serving_leader`, `wait`, and the
                        table and fast settings of the tests with simulated tablet servers
    module_imports      what a source module imports, from its syntax tree (`imported_modules`),
                        for tests that pin which module may import which
    raft_node           RaftNode clusters in one event loop over an in-memory network, real WALs
                        (`Cluster`, `run`, `eventually`)
    rowstore            `Writer`: writes applied to a RowStore at increasing indexes, through the
                        replicated form
    status_pages        status pages and /metrics of real processes over HTTP (`fetch`,
                        `parse_metrics`, `metrics_of`), and `create_table` through a MiniCluster
    sys_catalog         sys.catalog records and writes built by hand (`make_table`,
                        `make_tablets`, `create_table_write`), `apply_ok` / `refusal_of`, and a
                        `FakeRaft` that applies proposals straight to the state
    tablet_reports      one tablet's records to judge reports against (`TABLE`, `RUNNING`), what
                        every server of a catalog env reports, and heartbeats carrying it
    tserver_inproc      one real tablet server in-process with gRPC stubs (`Server`), and `run`
                        for async test bodies
"""
