"""The master: sys.catalog, catalog manager, tablet server registry, placement (issue 3)."""
