"""Tessera: a Raft-replicated metadata service for tablet-partitioned data, in the style of Kudu.

Start at docs/design/README.md: it opens with the system map (the processes, and the packages
of this code from `pb` at the bottom up to `tools`, with `spark_jobs` above them) and follows
one CreateTable from the client to the tablet servers and back. Each subpackage's `__init__.py`
maps its modules.
"""
