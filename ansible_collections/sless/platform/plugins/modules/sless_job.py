#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sless_job
short_description: Run sless functions once, as jobs with a run counter
description:
  - A job runs its function once with O(event). It runs again only when O(run_id) grows, so the same task
    applied twice runs the job once (an existing job with the same O(run_id) is success, not an error).
  - O(run_id) V(0) records the job without running it; a smaller O(run_id) than the job's fails.
version_added: "0.1.0"
author: sless maintainers
extends_documentation_fragment:
  - sless.platform.api
options:
  name:
    description: The job's name.
    type: str
    required: true
  state:
    description: V(present) creates (and runs) it, V(absent) deletes it.
    type: str
    choices: [present, absent]
    default: present
  function:
    description: The function to run; required to create the job.
    type: str
  event:
    description: The JSON object the function receives.
    type: dict
    default: {}
  run_id:
    description: The run counter; raise it to run the job again.
    type: int
    default: 1
  wait:
    description: Wait until the run has finished.
    type: bool
    default: true
  wait_timeout:
    description: Seconds to wait for O(wait).
    type: int
    default: 900
  fail_on_error:
    description: Fail the task when the run failed.
    type: bool
    default: true
notes:
  - Supports check mode and diff mode.
  - The O(event) of an existing job is not changed; a new event needs a new job name.
"""

EXAMPLES = r"""
- name: Migrate the database once per release
  sless.platform.sless_job:
    name: migrate
    function: migrations
    event: {target: "2024-06"}
    run_id: 3
"""

RETURN = r"""
job:
  description: The job as the API answers it; C(message) holds the run's result or error.
  returned: when it exists after the task
  type: dict
  sample: {"name": "migrate", "function": "migrations", "run_id": 3, "phase": "Succeeded", "message": "{}"}
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sless.platform.plugins.module_utils.sless_api import SlessClient, api_argument_spec, name_path

DONE = ("Succeeded", "Failed", "Recorded")


def shown(record):
    return {} if record is None else dict((k, record.get(k)) for k in ("function", "run_id", "event"))


def wait_done(client, path, timeout):
    deadline = time.time() + timeout
    while True:
        record = client.call("GET", path)
        if record["phase"] in DONE:
            return record
        if time.time() > deadline:
            client.module.fail_json(msg="job %s did not finish within %ss (phase %s)"
                                    % (record["name"], timeout, record["phase"]), job=record)
        time.sleep(0.5)


def argument_spec():
    """The module's options (DOCUMENTATION lists the same, a unit test keeps them equal)."""
    spec = api_argument_spec()
    spec.update(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        function=dict(type="str"),
        event=dict(type="dict", default={}),
        run_id=dict(type="int", default=1),
        wait=dict(type="bool", default=True),
        wait_timeout=dict(type="int", default=900),
        fail_on_error=dict(type="bool", default=True),
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    client = SlessClient(module)
    path = client.ns_path("/jobs/%s" % name_path(params["name"]))
    current = client.get_or_none(path)
    result = dict(changed=False)

    if params["state"] == "absent":
        if current is not None:
            result.update(changed=True, diff=dict(before=shown(current), after={}))
            if not module.check_mode:
                client.call("DELETE", path)
        module.exit_json(**result)

    desired = dict(function=params["function"], run_id=params["run_id"], event=params["event"])
    if current is None:
        if not params["function"]:
            module.fail_json(msg="function is required to create job %s" % params["name"])
        result.update(changed=True, diff=dict(before={}, after=desired))
        if module.check_mode:
            module.exit_json(**result)
        current = client.call("POST", client.ns_path("/jobs"), dict(desired, name=params["name"]))
    elif params["function"] and params["function"] != current["function"]:
        module.fail_json(msg="job %s runs function %s, not %s: a job's function cannot change (use a new name)"
                         % (params["name"], current["function"], params["function"]), job=current)
    elif params["run_id"] < current["run_id"]:
        module.fail_json(msg="job %s is at run_id %s: run_id can only grow (asked for %s)"
                         % (params["name"], current["run_id"], params["run_id"]), job=current)
    elif params["run_id"] > current["run_id"]:
        after = dict(shown(current), run_id=params["run_id"])
        result.update(changed=True, diff=dict(before=shown(current), after=after))
        if module.check_mode:
            module.exit_json(job=current, **result)
        current = client.call("PATCH", path, {"run_id": params["run_id"]})
    if params["wait"] and not module.check_mode:
        current = wait_done(client, path, params["wait_timeout"])
    result["job"] = current
    if params["fail_on_error"] and current.get("phase") == "Failed":
        module.fail_json(msg="job %s failed: %s" % (params["name"], current.get("message")), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
