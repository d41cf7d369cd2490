"""The tablet server: tablet replicas (each its own Raft group), row storage, scans as Arrow,
admin RPCs, the heartbeater to every master, and tablet copy (issue 4)."""
