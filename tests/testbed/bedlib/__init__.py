"""The sless Kubernetes test bed: a real control plane on loopback, built from Go modules.

Standard library only, so the test bed can start before any virtualenv exists.
"""
