# -*- coding: utf-8 -*-
"""The connection options every sless module shares."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  url:
    description:
      - Base URL of the sless API.
      - Defaults to the environment variable E(SLESS_URL), else V(http://127.0.0.1:8090).
    type: str
  token:
    description:
      - Bearer token (JWT) of the tenant.
      - Defaults to the environment variable E(SLESS_TOKEN).
    type: str
  namespace:
    description:
      - The tenant namespace (C(sless-) and 16 hex digits).
      - Defaults to the token's own namespace (asked from C(/v1/whoami)).
    type: str
  validate_certs:
    description: Verify the API's TLS certificate.
    type: bool
    default: true
  timeout:
    description: Seconds one API request may take.
    type: int
    default: 60
"""
