#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sless_function
short_description: Create, update, upload and delete sless functions
description:
  - Makes a function of the tenant look as the task says; only the options given are compared.
  - O(source_dir) is zipped deterministically; its SHA-256 is compared with the function's C(code_hash),
    so an unchanged folder uploads nothing and rebuilds nothing.
  - With O(wait), the task ends when the function is C(Ready) and fails when its build is C(Failed).
version_added: "0.1.0"
author: sless maintainers
extends_documentation_fragment:
  - sless.platform.api
options:
  name:
    description: The function's name (a DNS-1123 label of at most 40 characters).
    type: str
    required: true
  state:
    description: V(present) creates or updates it, V(absent) deletes it with its triggers and jobs.
    type: str
    choices: [present, absent]
    default: present
  runtime:
    description: The runtime; required to create the function.
    type: str
    choices: [python3.11, nodejs20, go1.23]
  entrypoint:
    description: V(module.function) (Python, Node) or an exported Go function name.
    type: str
  memory_mb:
    description: Memory limit in MiB.
    type: int
  timeout_sec:
    description: Longest call in seconds.
    type: int
  env_vars:
    description:
      - Environment variables, all of them (variables left out are removed); the name the REST API, C(sless.json)
        and the CLI use.
    type: dict
    aliases: [env]
  secrets:
    description: "References to the tenant's secrets, each C({name, key, env}) or C({name, key, file})."
    type: list
    elements: dict
  scale:
    description:
      - Demand-driven replicas, between O(scale.min) and O(scale.max), aiming at O(scale.target) calls in flight per
        replica, back to O(scale.min) after O(scale.idle_sec) without calls. On Kubernetes it needs KEDA in the
        cluster (the API refuses it otherwise).
      - Only the sub-options given are compared and changed; the others keep the function's values (the API's
        defaults for a function that had no scale). Left out, the function's scale is not looked at.
      - O(scale.enabled=false) removes scaling (fixed replicas again).
    type: dict
    suboptions:
      min:
        description: Replicas when idle, 0 to 100 (0 scales to zero; API default 0).
        type: int
      max:
        description: Replicas at most, 1 to 100, not below O(scale.min) (API default 10).
        type: int
      target:
        description: Calls in flight per replica the scaler aims at, 1 to 1000 (API default 10).
        type: int
      idle_sec:
        description: Seconds without calls before going back to O(scale.min), 5 to 86400 (API default 300).
        type: int
      enabled:
        description: V(false) removes scaling; then no other sub-option may be given.
        type: bool
        default: true
  source_dir:
    description: Folder of the function's code, zipped and uploaded when its content changed.
    type: path
  wait:
    description: Wait until the function is C(Ready) (fail when its build fails).
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for O(wait).
    type: int
    default: 900
notes:
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Deploy the hello function from its folder
  sless.platform.sless_function:
    name: hello
    runtime: python3.11
    source_dir: "{{ playbook_dir }}/functions/hello"
    env_vars:
      GREETING: hi
    secrets:
      - {name: db, key: password, env: DB_PASSWORD}

- name: Scale it with demand, to zero when idle for ten minutes
  sless.platform.sless_function:
    name: hello
    scale:
      min: 0
      max: 5
      idle_sec: 600

- name: Back to fixed replicas
  sless.platform.sless_function:
    name: hello
    scale:
      enabled: false

- name: Remove it
  sless.platform.sless_function:
    name: hello
    state: absent
"""

RETURN = r"""
function:
  description: The function as the API answers it (absent when deleted or never created).
  returned: when it exists after the task
  type: dict
  sample: {"name": "hello", "runtime": "python3.11", "phase": "Ready", "code_hash": "4b1e..."}
code_hash:
  description: SHA-256 of the deterministic zip of O(source_dir).
  returned: when O(source_dir) is given
  type: str
uploaded:
  description: Whether the code was uploaded (changed) in this run.
  returned: always
  type: bool
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sless.platform.plugins.module_utils.sless_api import (
    SlessClient,
    api_argument_spec,
    name_path,
    subset_differs,
)
from ansible_collections.sless.platform.plugins.module_utils.sless_code import zip_folder

SPEC_FIELDS = ("runtime", "entrypoint", "memory_mb", "timeout_sec", "env_vars", "secrets", "scale")
SCALE_FIELDS = ("min", "max", "target", "idle_sec")


def desired_spec(params):
    spec = {
        "runtime": params["runtime"],
        "entrypoint": params["entrypoint"],
        "memory_mb": params["memory_mb"],
        "timeout_sec": params["timeout_sec"],
        "env_vars": params["env_vars"],
        "secrets": params["secrets"],
    }
    if spec["env_vars"] is not None:
        spec["env_vars"] = dict((str(k), str(v)) for k, v in spec["env_vars"].items())
    if spec["secrets"] is not None:
        spec["secrets"] = [dict((k, v) for k, v in ref.items() if v is not None) for ref in spec["secrets"]]
    return dict((k, v) for k, v in spec.items() if v is not None)


def wanted_scale(option, current):
    """(stated, scale): whether the task states a scale, and the one the function must have (None: fixed replicas).

    Sub-options left out keep CURRENT's values, so a task that states only O(scale.max) reports no change once the
    function has that max; raises ValueError for O(scale.enabled=false) beside other sub-options.
    """
    if option is None:
        return False, None
    given = dict((k, option[k]) for k in SCALE_FIELDS if option.get(k) is not None)
    if option.get("enabled") is False:
        if given:
            raise ValueError("scale.enabled=false removes scaling: give no %s with it" % "/".join(sorted(given)))
        return True, None
    return True, dict(current or {}, **given)


def shown(record, code_hash=None):
    """What diff mode shows of a function: its spec and code hash."""
    if record is None:
        return {}
    out = dict((k, record.get(k)) for k in SPEC_FIELDS)
    out["code_hash"] = code_hash if code_hash is not None else record.get("code_hash")
    return out


def wait_ready(client, path, timeout):
    deadline = time.time() + timeout
    while True:
        record = client.call("GET", path)
        if record["phase"] == "Ready":
            return record
        if record["phase"] == "Failed":
            client.module.fail_json(msg="function %s failed: %s" % (record["name"], record["message"]),
                                    function=record)
        if record["phase"] == "Pending" and not record.get("code_hash"):
            return record  # no code yet: nothing will make it Ready
        if time.time() > deadline:
            client.module.fail_json(msg="function %s is not Ready after %ss (phase %s: %s)"
                                    % (record["name"], timeout, record["phase"], record["message"]),
                                    function=record)
        time.sleep(0.5)


def argument_spec():
    """The module's options (DOCUMENTATION lists the same, a unit test keeps them equal)."""
    spec = api_argument_spec()
    spec.update(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        runtime=dict(type="str", choices=["python3.11", "nodejs20", "go1.23"]),
        entrypoint=dict(type="str"),
        memory_mb=dict(type="int"),
        timeout_sec=dict(type="int"),
        env_vars=dict(type="dict", aliases=["env"]),
        secrets=dict(type="list", elements="dict", no_log=False),
        scale=dict(type="dict", options=dict(
            min=dict(type="int"), max=dict(type="int"), target=dict(type="int"), idle_sec=dict(type="int"),
            enabled=dict(type="bool", default=True))),
        source_dir=dict(type="path"),
        wait=dict(type="bool", default=True),
        wait_timeout=dict(type="int", default=900),
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    client = SlessClient(module)
    path = client.ns_path("/functions/%s" % name_path(params["name"]))
    current = client.get_or_none(path)
    result = dict(changed=False, uploaded=False)

    if params["state"] == "absent":
        if current is not None:
            result.update(changed=True, diff=dict(before=shown(current), after={}))
            if not module.check_mode:
                client.call("DELETE", path)
        module.exit_json(**result)

    archive, code_hash = None, None
    if params["source_dir"]:
        try:
            archive, code_hash = zip_folder(params["source_dir"])
        except (OSError, ValueError) as exc:
            module.fail_json(msg="source_dir %s: %s" % (params["source_dir"], exc))
        result["code_hash"] = code_hash

    spec = desired_spec(params)
    try:
        scale_stated, scale = wanted_scale(params["scale"], current.get("scale") if current else None)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if current is None:
        if scale is not None:
            spec["scale"] = scale
        if "runtime" not in spec:
            module.fail_json(msg="runtime is required to create function %s" % params["name"])
        result["changed"] = True
        after = dict(shown(dict(spec, name=params["name"]), code_hash))
        result["diff"] = dict(before={}, after=after)
        if module.check_mode:
            module.exit_json(**result)
        client.call("POST", client.ns_path("/ensure"))
        current = client.call("POST", client.ns_path("/functions"), dict(spec, name=params["name"]))
    else:
        differs = subset_differs(spec, current)
        if scale_stated and current.get("scale") != scale:
            spec["scale"] = scale  # None removes it: compared here, since subset_differs skips None
            differs = sorted([*differs, "scale"])
        upload_needed = code_hash is not None and current.get("code_hash") != code_hash
        if differs or upload_needed:
            after = dict(shown(current), **dict((k, spec[k]) for k in differs))
            if upload_needed:
                after["code_hash"] = code_hash
            result.update(changed=True, diff=dict(before=shown(current), after=after))
        if differs and not module.check_mode:
            current = client.call("PUT", path, dict((k, spec[k]) for k in differs))
        if module.check_mode:
            result["function"] = current
            module.exit_json(**result)

    if code_hash is not None and current.get("code_hash") != code_hash:
        current = client.call("POST", path + "/upload", data=archive, content_type="application/zip")
        result.update(changed=True, uploaded=True)
    if params["wait"]:
        current = wait_ready(client, path, params["wait_timeout"])
    result["function"] = current
    module.exit_json(**result)


if __name__ == "__main__":
    main()
