"""The `sless` command line: a client of the REST API (``sless up`` itself is a composition root: ``main.up``)."""
