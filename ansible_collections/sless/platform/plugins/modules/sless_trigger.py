#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sless_trigger
short_description: Manage http, cron and event triggers of sless functions
description:
  - Makes a trigger look as the task says; only the options given are compared.
  - A trigger's O(type) cannot change in place; a different type replaces the trigger (delete, then create).
version_added: "0.1.0"
author: sless maintainers
extends_documentation_fragment:
  - sless.platform.api
options:
  name:
    description: The trigger's name.
    type: str
    required: true
  state:
    description: V(present) creates or changes it, V(absent) deletes it.
    type: str
    choices: [present, absent]
    default: present
  type:
    description: What fires it; required to create it.
    type: str
    choices: [http, cron, event]
  function:
    description: The function it calls; required to create it.
    type: str
  enabled:
    description: Whether it fires.
    type: bool
  schedule:
    description: 5-field cron expression (cron triggers).
    type: str
  queue:
    description: Queue name (event triggers).
    type: str
  delivery:
    description: >-
      Event triggers - whether a call a crash interrupted is dead-lettered (at_most_once, the platform's default)
      or made again (at_least_once).
    type: str
    choices: [at_most_once, at_least_once]
  methods:
    description: Http triggers - the HTTP methods that reach the function (others are answered 405).
    type: list
    elements: str
  cors:
    description: >-
      Http triggers - CORS settings the platform answers with (origins, and optionally methods, headers,
      credentials, max_age), as the REST API takes them.
    type: dict
  path:
    description: >-
      Http triggers - the path pattern below the function's URL the trigger serves, such as C(/users/{id}); its
      parameters reach the handler in the event's C(_params). Without it the trigger serves every path no other
      trigger's pattern serves.
    type: str
  auth:
    description: Who may call an http trigger.
    type: str
    choices: [public, token]
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Call hello over HTTP
  sless.platform.sless_trigger:
    name: hello
    type: http
    function: hello

- name: Run report every night
  sless.platform.sless_trigger:
    name: nightly
    type: cron
    function: report
    schedule: "0 3 * * *"
"""

RETURN = r"""
trigger:
  description: The trigger as the API answers it (with its C(url) for http triggers).
  returned: when it exists after the task
  type: dict
  sample: {"name": "hello", "type": "http", "function": "hello", "enabled": true, "url": "http://..."}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sless.platform.plugins.module_utils.sless_api import (
    SlessClient,
    api_argument_spec,
    name_path,
    subset_differs,
)

FIELDS = ("type", "function", "enabled", "schedule", "queue", "auth", "delivery", "methods", "cors", "path")


def shown(record):
    return {} if record is None else dict((k, record.get(k)) for k in FIELDS)


def argument_spec():
    """The module's options (DOCUMENTATION lists the same, a unit test keeps them equal)."""
    spec = api_argument_spec()
    spec.update(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        type=dict(type="str", choices=["http", "cron", "event"]),
        function=dict(type="str"),
        enabled=dict(type="bool"),
        schedule=dict(type="str"),
        queue=dict(type="str"),
        delivery=dict(type="str", choices=["at_most_once", "at_least_once"]),
        methods=dict(type="list", elements="str"),
        cors=dict(type="dict"),
        path=dict(type="str"),
        auth=dict(type="str", choices=["public", "token"]),
    )
    return spec


def same_setting(key, wanted, current):
    """Whether a stated setting already holds as the API keeps it: methods in any order and case, and of cors
    only the sub-keys stated (the API fills in the others' defaults; header names in lower case)."""
    if key == "methods":
        return isinstance(current, list) and sorted(m.upper() for m in wanted) == sorted(current)
    if key == "cors" and isinstance(wanted, dict) and isinstance(current, dict):
        for sub, value in wanted.items():
            if sub in ("methods", "headers") and isinstance(value, list):
                stated = sorted(v.upper() if sub == "methods" else v.lower() for v in value)
                if sorted(current.get(sub) or []) != stated:
                    return False
            elif current.get(sub) != value:
                return False
        return True
    return False


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    client = SlessClient(module)
    path = client.ns_path("/triggers/%s" % name_path(params["name"]))
    current = client.get_or_none(path)
    result = dict(changed=False)

    if params["state"] == "absent":
        if current is not None:
            result.update(changed=True, diff=dict(before=shown(current), after={}))
            if not module.check_mode:
                client.call("DELETE", path)
        module.exit_json(**result)

    desired = dict((k, params[k]) for k in FIELDS if params[k] is not None)
    if current is not None and desired.get("type", current["type"]) != current["type"]:
        result.update(changed=True, replaced=True)
        if not module.check_mode:
            client.call("DELETE", path)
        before, current = shown(current), None
    else:
        before = shown(current)
    if current is None:
        missing = [k for k in ("type", "function") if k not in desired]
        if missing:
            module.fail_json(msg="%s required to create trigger %s" % (" and ".join(missing), params["name"]))
        result.update(changed=True, diff=dict(before=before, after=dict(shown(desired))))
        if not module.check_mode:
            result["trigger"] = client.call("POST", client.ns_path("/triggers"), dict(desired, name=params["name"]))
        module.exit_json(**result)

    differs = [k for k in subset_differs(desired, current) if not same_setting(k, desired[k], current.get(k))]
    result["trigger"] = current
    if differs:
        after = dict(shown(current), **dict((k, desired[k]) for k in differs))
        result.update(changed=True, diff=dict(before=before, after=after))
        if not module.check_mode:
            result["trigger"] = client.call("PATCH", path, dict((k, desired[k]) for k in differs))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
