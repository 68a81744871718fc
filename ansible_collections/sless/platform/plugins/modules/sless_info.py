#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sless_info
short_description: Read the tenant's sless functions, triggers, jobs and secrets
description:
  - Lists what the tenant has, or reads one object by name. Secrets show names, keys and versions only.
version_added: "0.1.0"
author: sless maintainers
extends_documentation_fragment:
  - sless.platform.api
options:
  kinds:
    description: What to read.
    type: list
    elements: str
    choices: [functions, triggers, jobs, secrets]
    default: [functions, triggers, jobs, secrets]
  name:
    description: Read only the object of this name (of each kind in O(kinds)); missing ones are left out.
    type: str
notes:
  - Reads only; supports check mode.
"""

EXAMPLES = r"""
- name: Everything of the tenant
  sless.platform.sless_info:
  register: tenant

- name: One function
  sless.platform.sless_info:
    kinds: [functions]
    name: hello
  register: hello
"""

RETURN = r"""
namespace:
  description: The tenant namespace read.
  returned: always
  type: str
functions:
  description: Functions, as the API answers them.
  returned: when asked for
  type: list
  elements: dict
triggers:
  description: Triggers.
  returned: when asked for
  type: list
  elements: dict
jobs:
  description: Jobs.
  returned: when asked for
  type: list
  elements: dict
secrets:
  description: Secrets (names, keys, versions).
  returned: when asked for
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sless.platform.plugins.module_utils.sless_api import SlessClient, api_argument_spec, name_path

KINDS = ("functions", "triggers", "jobs", "secrets")


def argument_spec():
    """The module's options (DOCUMENTATION lists the same, a unit test keeps them equal)."""
    spec = api_argument_spec()
    spec.update(
        kinds=dict(type="list", elements="str", choices=list(KINDS), default=list(KINDS)),
        name=dict(type="str"),
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    client = SlessClient(module)
    result = dict(changed=False, namespace=client.namespace)
    for kind in module.params["kinds"]:
        if module.params["name"]:
            found = client.get_or_none(client.ns_path("/%s/%s" % (kind, name_path(module.params["name"]))))
            result[kind] = [found] if found else []
        else:
            result[kind] = client.items("/" + kind)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
