"""Building blocks every other package uses.

* `errors`: the one error tree, its stable codes and the gRPC mapping in both directions;
* `config`: frozen-dataclass configuration loaded strictly from `conf/*.toml`;
* `ids`: `NewType` ids (`NodeId`, `TableId`, `TabletId`) and uuid helpers;
* `clock`: the `Clock` protocol, `RealClock` and the deterministic `ManualClock`;
* `logging`: one log format for every process, with the node in each line.

Nothing is re-exported here, so importing one module (say `clock`) does not import the rest
(`errors` pulls in grpc).
"""
