"""Replica rebalancing, pure: given where every voter replica is, which moves even out the
servers and the tables across them (`rebalancing`). The leader master runs it to plan and apply
moves (`tessera cluster rebalance`), the client applies one move (`replica_ops`), and the Spark
job `rebalance_plan` prints a plan from a catalog snapshot. A package of its own, below the
master and the client, because all three use it and it depends on nothing but `service.common`
(docs/design/layers.md#R1), as Kudu keeps its rebalancer in its own `rebalance` library.

    rebalancing   Distribution (voter replicas, live servers, pinned tablets), the moves that
                  balance it, and their checks
"""
