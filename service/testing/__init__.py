"""Test support: simulators, harnesses, checkers and process launchers.

Imported only by tests/, service.tools and bench/ (docs/design/layers.md#R3); it may import
anything.

Modules
-------
    simulator           deterministic simulation of a Raft group: the real core and WAL, a
                        simulated world, safety checks after every step
    sim_network         the network a simulator holds: messages in flight, delays, drops,
                        partitions
    sim_quiesce         quiescence in the simulator
    sim_cli             `make sim`: the simulator over many seeds
    simdisk             an in-memory file system that can lose power (torn writes, fsync errors)
    raft_harness        a synchronous in-memory cluster of RawNodes for unit tests
    linearizability     the linearizability checker for client histories
    demo_cluster        KV demo nodes as real processes on loopback
    master_cluster      master processes on loopback
    mini_cluster        masters and tablet servers as real processes on loopback
                        (all three start, wait for and stop their processes with
                        service.tools.launcher)
    ts_simulator        many simulated tablet servers in one process, for master tests and
                        benchmarks
    ts_simulator_stats  the tablet-server simulator's statistics file
    ts_simulator_shards the simulator as several processes (`--shards K`): the bus between them
    tablet_fixtures     schemas, rows, requests and scans for tests and benchmarks
    hostile_arrow       Arrow IPC streams that frame correctly but lie (poison writes), and
                        valid rows sent to a tablet that does not hold their keys (misrouted)
    poison_log          a committed entry no replica can apply, planted in a stopped WAL
    spark_standalone    a Spark standalone cluster on loopback
    chaos*              the fault campaign on real processes (`make chaos`): the campaign,
                        its cluster in network namespaces, nemeses, workloads, checks, report
    fuzz*               the fuzzing campaign against a live secured cluster (`make fuzz`):
                        the campaign, its cluster and identities (a member tablet server's
                        own certificate among them), generator, templates and values, the
                        guard, placeholders filled before sending, checks, report
"""
