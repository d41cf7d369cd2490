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
    cluster             `Cluster(spec)`: masters and tablet servers as real processes on
                        loopback, from a `service.tools.cluster_spec.ClusterSpec`; started,
                        stopped, killed and restarted by name (with service.tools.launcher)
    master_cluster      `MasterCluster`: the masters of a Cluster as a group, or a cluster of
                        masters only
    mini_cluster        `MiniCluster`: a Cluster from the keyword arguments tests use
    demo_cluster        KV demo nodes as real processes on loopback (launcher.ServerProcess)
    ts_simulator        many simulated tablet servers in one process, for master tests and
                        benchmarks
    ts_simulator_stats  the tablet-server simulator's statistics file
    ts_simulator_shards the simulator as several processes (`--shards K`): the bus between them
    tablet_fixtures     schemas, rows, requests and scans for tests and benchmarks
    hostile_arrow       Arrow IPC streams that frame correctly but lie (poison writes), and
                        valid rows sent to a tablet that does not hold their keys (misrouted)
    poison_log          a committed entry no replica can apply, planted in a stopped WAL
    spark_standalone    a Spark standalone cluster on loopback

    (the fault campaign on real processes, `make chaos`, after Jepsen)
    chaos               the campaign: every workload x nemesis run, replay commands
    chaos_cluster       a mini cluster whose every process lives in its own network namespace
    chaos_net           the namespaces, and the hooks that cut links, skew clocks, break disks
    chaos_nemesis       the nemeses: kill, pause, partition, clock, disk; each heals its faults
    chaos_workloads     the clients, recording every operation as invoked, then ok/fail/info
    chaos_checks        the histories and their checkers: linearizability per key, lost or
                        phantom rows, the catalog against a model
    chaos_report        the workload x nemesis table, the closing line, latency plots

    (the fuzzing campaign against a live secured cluster, `make fuzz`)
    fuzz                the campaign: one case at a time, checked after each; reproducers
    fuzz_cluster        its cluster, identities (a member tablet server's own certificate
                        among them) and fixture tables
    fuzz_gen            the generator: every RPC of every service, as Hypothesis strategies
    fuzz_templates      requests valid as a whole, for RPCs whose fields must agree
    fuzz_values         hostile constants, what each field names, byte mutations, the vocabulary
    fuzz_guard          destructive valid requests pointed at a scratch table; KNOWN_ISSUES
    fuzz_prepare        placeholders filled in before sending; what an accepted case created,
                        removed after it
    fuzz_checks         the checks after the cases: liveness, catalog and replica state,
                        rows inside their partition, event-loop stalls
    fuzz_report         the counts, and how a finding and its reproducers read
"""
