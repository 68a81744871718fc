# -*- coding: utf-8 -*-
"""A small client of the sless REST API for the collection's modules.

Every failure ends the module with ``fail_json`` and a message built from the API's own JSON error
(``{"error": ..., "field": ...}``), never a traceback. Only the standard library and Ansible's ``open_url``
are used, so the modules run wherever Ansible runs.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.six.moves.urllib.parse import quote
from ansible.module_utils.urls import open_url

DEFAULT_URL = "http://127.0.0.1:8090"


def api_argument_spec():
    """The options every module takes (see the api doc fragment)."""
    return dict(
        url=dict(type="str"),
        token=dict(type="str", no_log=True),
        namespace=dict(type="str"),
        validate_certs=dict(type="bool", default=True),
        timeout=dict(type="int", default=60),
    )


class ApiError(Exception):
    """A non-2xx answer: its status, the API's error text and field."""

    def __init__(self, status, message, field=None, body=None):
        super(ApiError, self).__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.body = body or {}


class SlessClient(object):
    def __init__(self, module):
        self.module = module
        params = module.params
        self.url = (params.get("url") or os.environ.get("SLESS_URL") or DEFAULT_URL).rstrip("/")
        self.token = params.get("token") or os.environ.get("SLESS_TOKEN")
        if not self.token:
            module.fail_json(msg="no token: set the token option or the SLESS_TOKEN environment variable")
        self.validate_certs = params.get("validate_certs", True)
        self.timeout = params.get("timeout") or 60
        self._namespace = params.get("namespace")

    def raw(self, method, path, body=None, data=None, content_type=None):
        """(status, decoded JSON or None) of one request; raises ApiError for a non-2xx answer."""
        headers = {"Authorization": "Bearer %s" % self.token, "Accept": "application/json"}
        payload = data
        if body is not None:
            payload = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        elif content_type:
            headers["Content-Type"] = content_type
        try:
            resp = open_url(self.url + path, method=method, data=payload, headers=headers,
                            validate_certs=self.validate_certs, timeout=self.timeout)
            status, text = resp.getcode(), resp.read()
        except HTTPError as exc:
            status, text = exc.code, exc.read()
        except (URLError, OSError) as exc:
            raise ApiError(0, "cannot reach the sless API at %s: %s" % (self.url, exc)) from None
        decoded = None
        if text:
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
        if status >= 400:
            error = decoded.get("error") if isinstance(decoded, dict) else None
            field = decoded.get("field") if isinstance(decoded, dict) else None
            raise ApiError(status, error or "HTTP %s" % status, field, decoded if isinstance(decoded, dict) else None)
        return status, decoded

    def call(self, method, path, body=None, **kwargs):
        """The decoded answer, or the module fails with the API's error text."""
        try:
            return self.raw(method, path, body, **kwargs)[1]
        except ApiError as exc:
            self.fail(method, path, exc)

    def fail(self, method, path, exc):
        message = "%s %s: HTTP %s: %s" % (method, path, exc.status, exc.message)
        extra = {"status": exc.status}
        if exc.field:
            extra["field"] = exc.field
        self.module.fail_json(msg=message, **extra)

    def get_or_none(self, path):
        """The object at PATH, or None when the API answers 404."""
        try:
            return self.raw("GET", path)[1]
        except ApiError as exc:
            if exc.status == 404:
                return None
            self.fail("GET", path, exc)

    @property
    def namespace(self):
        if not self._namespace:
            self._namespace = self.call("GET", "/v1/whoami")["namespace"]
        return self._namespace

    def ns_path(self, rest):
        return "/v1/namespaces/%s%s" % (quote(self.namespace, safe=""), rest)

    def items(self, rest):
        """Every item of a paged listing."""
        found, cursor = [], None
        while True:
            query = "?limit=1000" + ("&cursor=%s" % quote(cursor, safe="") if cursor else "")
            page = self.call("GET", self.ns_path(rest) + query)
            found.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                return found


def name_path(name):
    """A name as one path segment (the API validates it; quoting keeps it one segment anyway)."""
    return quote(name, safe="")


def subset_differs(desired, current):
    """The keys of DESIRED whose values differ from CURRENT's (only what the playbook states counts)."""
    return sorted(k for k, v in desired.items() if v is not None and current.get(k) != v)
