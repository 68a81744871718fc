"""Contracts shared by the sless API and operator: names, the resource model and its validation.

Both components import from here and never from each other, so a rule (a name pattern, a default,
a bound) is stated once and cannot drift between what the API accepts and what the operator builds.
"""
