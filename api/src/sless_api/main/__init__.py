"""The composition roots: the only place that reads the environment and wires stores, services, backends and
the REST API into a process (``sless-api``, ``sless up``, ``sless-events``)."""
