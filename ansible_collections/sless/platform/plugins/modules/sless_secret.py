#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sless_secret
short_description: Manage the tenant's sless secrets (write-only values)
description:
  - Stores O(data) as the secret O(name); functions reference its keys as environment variables or files.
  - The API never returns values, so the module cannot see whether a stored value differs. With
    O(update=on_change) (the default) it writes when the secret is missing or its set of keys differs;
    with O(update=always) it writes on every run (and reports a change every time).
  - Writing a secret restarts the functions that use it.
version_added: "0.1.0"
author: sless maintainers
extends_documentation_fragment:
  - sless.platform.api
options:
  name:
    description: The secret's name.
    type: str
    required: true
  state:
    description: V(present) writes it, V(absent) deletes it (refused by the API while a function uses it).
    type: str
    choices: [present, absent]
    default: present
  data:
    description: Every key of the secret with its value; required for V(present).
    type: dict
  update:
    description: When an existing secret is written again.
    type: str
    choices: [on_change, always]
    default: on_change
notes:
  - Supports check mode and diff mode; diffs show keys only, never values.
"""

EXAMPLES = r"""
- name: Database credentials for the functions
  sless.platform.sless_secret:
    name: db
    data:
      password: "{{ vault_db_password }}"
      user: app
  no_log: true

- name: Rotate (write even though the keys are the same)
  sless.platform.sless_secret:
    name: db
    data: {password: "{{ new_password }}", user: app}
    update: always
  no_log: true
"""

RETURN = r"""
secret:
  description: The secret's name, keys and version (never its values).
  returned: when it exists after the task
  type: dict
  sample: {"name": "db", "keys": ["password", "user"], "version": 2}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sless.platform.plugins.module_utils.sless_api import SlessClient, api_argument_spec, name_path


def shown(keys):
    return {"keys": sorted(keys)} if keys is not None else {}


def argument_spec():
    """The module's options (DOCUMENTATION lists the same, a unit test keeps them equal)."""
    spec = api_argument_spec()
    spec.update(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        data=dict(type="dict", no_log=True),
        update=dict(type="str", choices=["on_change", "always"], default="on_change"),
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True,
                           required_if=[("state", "present", ["data"])])
    params = module.params
    client = SlessClient(module)
    path = client.ns_path("/secrets/%s" % name_path(params["name"]))
    current = client.get_or_none(path)
    result = dict(changed=False)

    if params["state"] == "absent":
        if current is not None:
            result.update(changed=True, diff=dict(before=shown(current["keys"]), after={}))
            if not module.check_mode:
                client.call("DELETE", path)
        module.exit_json(**result)

    data = dict((str(k), "" if v is None else str(v)) for k, v in params["data"].items())
    before = shown(current["keys"]) if current else {}
    write = current is None or params["update"] == "always" or sorted(current["keys"]) != sorted(data)
    result["secret"] = current
    if write:
        result.update(changed=True, diff=dict(before=before, after=shown(data)))
        if not module.check_mode:
            if current is None:
                client.call("POST", client.ns_path("/ensure"))
                body = {"name": params["name"], "data": data}
                result["secret"] = client.call("POST", client.ns_path("/secrets"), body)
            else:
                result["secret"] = client.call("PUT", path, {"data": data})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
