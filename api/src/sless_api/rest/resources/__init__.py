"""Falcon resources, one module per REST resource."""
