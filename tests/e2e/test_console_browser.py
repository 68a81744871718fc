"""The console in a real browser (Debian's headless Chromium through chromedriver), against a real `sless up`.

Each test signs in with its own tenant's token and works the page as a user would: the function list, a
function's detail, toggling a trigger, invoking with a body, uploading code by drag and drop and by the file
picker, jobs, and creating, editing and deleting functions, triggers, jobs and secrets (by keyboard, refusals next
to their field). Waits are bounded polls on what the page shows; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement

from tests.support.console import (
    WAIT,
    accept_dialog,
    browser,
    fill,
    focused,
    open_function,
    sign_in,
    submit_login,
    text,
    until,
)
from tests.support.platform import SlessProcess, Tenant, make_zip

pytestmark = pytest.mark.e2e
__all__ = ["browser"]  # the module's fixture, from tests.support.console
HELLO = "def handle(event):\n    return {'hello': event.get('name')}\n"


def records(tenant: Tenant, name: str) -> list[dict[str, Any]]:
    return list(tenant.api("GET", f"/functions/{name}/invocations?limit=100", expect=200).json()["items"])


def test_sign_in_list_detail_and_toggle_a_trigger(browser: webdriver.Chrome, sless: SlessProcess,
                                                   tenant: Tenant) -> None:
    tenant.deploy("listed-fn", "python3.11", {"handler.py": HELLO})
    browser.get(f"{sless.url}/console")
    browser.execute_script("sessionStorage.clear();")
    browser.find_element(By.ID, "token").send_keys("not-a-token")
    submit_login(browser)
    api_error = requests.get(f"{sless.url}/v1/whoami", headers={"Authorization": "Bearer not-a-token"},
                             timeout=30).json()["error"]
    until(browser, lambda d: text(d, "login-error") == api_error)
    assert browser.find_element(By.ID, "functions").is_displayed() is False

    sign_in(browser, sless, tenant)
    row = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-function='listed-fn']"))[0]
    assert "Ready" in row.text and f"/fn/{tenant.ns}/listed-fn" in row.text
    open_function(browser, "listed-fn")
    until(browser, lambda d: "def handle" in text(d, "source"))

    box = browser.find_element(By.CSS_SELECTOR, "input[data-trigger='listed-fn']")
    assert box.is_selected()
    box.send_keys(Keys.SPACE)  # toggle with the keyboard
    until(browser, lambda d: text(d, "detail-status") == "listed-fn disabled")
    assert tenant.api("GET", "/triggers/listed-fn", expect=200).json()["enabled"] is False
    assert requests.get(tenant.fn_url("listed-fn"), timeout=30).status_code == 404
    until(browser, lambda d: not d.find_element(By.ID, "invoke-send").is_enabled())
    assert "No enabled http trigger" in text(browser, "invoke-status")
    until(browser, lambda d: "http (off)" in d.find_element(By.CSS_SELECTOR, "tr[data-function='listed-fn']").text)

    browser.find_element(By.CSS_SELECTOR, "input[data-trigger='listed-fn']").click()
    until(browser, lambda d: text(d, "detail-status") == "listed-fn enabled")
    assert tenant.api("GET", "/triggers/listed-fn", expect=200).json()["enabled"] is True
    until(browser, lambda d: d.find_element(By.ID, "invoke-send").is_enabled())
    assert requests.get(tenant.fn_url("listed-fn"), timeout=30).status_code == 200


ECHO = """
import sys
def handle(event):
    print('console-log-line', event.get('name'))
    print('console-err-line', file=sys.stderr)
    return {'hello': event.get('name'), 'method': event['_method'], 'path': event['_path']}
"""

# A hostile answer: as HTML it would run a script, fire an onerror handler and load an image from the beacon
# function (recorded there as an invocation). Shown as text, none of that can happen.
HOSTILE = """
def handle(event):
    ns = event['_path'] and event['_headers'].get('x-beacon-ns', '')
    page = ('<script>document.title="pwned";fetch("/fn/{ns}/beacon/from-script")</script>'
            '<img src="/fn/{ns}/beacon/from-answer" onerror="document.title=\\'pwned\\'">'
            '<b id="hostile-bold">bold</b>')
    if event['_path'] == '/redirect':
        return {'statusCode': 307, 'headers': {'Location': '/fn/' + event['_query']['ns'] + '/beacon/redirected'},
                'body': ''}
    return {'statusCode': 200, 'headers': {'Content-Type': 'text/html', 'X-Hostile': '<i>x</i>'},
            'body': page.replace('{ns}', event['_query']['ns'])}
"""
BEACON = "def handle(event):\n    return {'seen': event['_path']}\n"


def invoke(driver: webdriver.Chrome, method: str, path: str, body: str) -> None:
    driver.find_element(By.ID, "invoke-method").send_keys(method)
    field = driver.find_element(By.ID, "invoke-path")
    field.clear()
    field.send_keys(path)
    payload = driver.find_element(By.ID, "invoke-payload")
    payload.clear()
    if body:
        payload.send_keys(body)
    driver.execute_script("document.getElementById('invoke-status').textContent = '';")
    send = driver.find_element(By.ID, "invoke-send")
    until(driver, lambda d: send.is_enabled())  # a click on a disabled button would be lost
    send.click()
    until(driver, lambda d: text(d, "invoke-status") not in ("", "calling…"))


def test_invoke_shows_the_answer_its_request_id_and_its_logs(browser: webdriver.Chrome, sless: SlessProcess,
                                                            tenant: Tenant) -> None:
    tenant.deploy("echo-fn", "python3.11", {"handler.py": ECHO})
    sign_in(browser, sless, tenant)
    open_function(browser, "echo-fn")
    invoke(browser, "POST", "/some/where", '{"name": "console"}')
    assert text(browser, "invoke-status") == "200 OK"
    answer = json.loads(text(browser, "invoke-body"))
    assert answer == {"hello": "console", "method": "POST", "path": "/some/where"}
    assert "content-type: application/json" in text(browser, "invoke-headers")
    request_id = text(browser, "invoke-request-id")
    assert request_id.startswith("console-")
    shown = until(browser, lambda d: d.find_elements(By.ID, "invoke-record"))[0]
    (record,) = [r for r in records(tenant, "echo-fn") if r["request_id"] == request_id]
    assert record["method"] == "POST" and record["status"] == 200
    assert request_id in shown.text and f"{record['id']}" in shown.text
    lines = browser.find_element(By.ID, "invoke-log-lines")  # sless up keeps each call's output
    assert "stdout console-log-line console" in lines.text and "stderr console-err-line" in lines.text
    assert "@sless:" not in lines.text  # the runtime's tags are the platform's, not shown

    # The same call's lines again, later, from its row under Recent invocations.
    browser.find_element(By.ID, "refresh").click()
    row = f"tr[data-invocation='{record['id']}']"
    button = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} button.call-logs"))[0]
    assert browser.find_element(By.CSS_SELECTOR, row).text.split()[5] in ("cold", "warm")
    button.send_keys(Keys.ENTER)
    again = until(browser, lambda d: d.find_elements(By.ID, "call-log-lines"))[0]
    assert "stdout console-log-line console" in again.text and "stderr console-err-line" in again.text
    assert request_id in text(browser, "call-record")
    until(browser, lambda d: d.find_element(By.ID, "invocation-logs") == d.switch_to.active_element)

    invoke(browser, "GET", "/", "")
    assert text(browser, "invoke-status") == "200 OK"
    assert json.loads(text(browser, "invoke-body"))["method"] == "GET"
    invoke(browser, "GET", "/", '{"a": 1}')
    assert "GET carries no body" in text(browser, "invoke-status")


def test_where_the_api_has_no_call_logs_the_record_is_shown(browser: webdriver.Chrome, sless: SlessProcess,
                                                             tenant: Tenant) -> None:
    """The Kubernetes backend answers 501 where the cluster does not let the API read pod logs. That fault is
    simulated in the page (a fetch wrapper answering 501 for the logs route only): `sless up` always has them."""
    tenant.deploy("echo-fn", "python3.11", {"handler.py": ECHO})
    sign_in(browser, sless, tenant)
    open_function(browser, "echo-fn")
    browser.execute_script("""
        const real = window.fetch;
        window.fetch = (url, init) => /\\/invocations\\/[^/]+\\/logs$/.test(String(url))
          ? Promise.resolve(new Response('{"error": "pod logs are not readable here"}', { status: 501 }))
          : real(url, init);""")
    invoke(browser, "POST", "/", '{"name": "k8s"}')
    shown = until(browser, lambda d: d.find_elements(By.ID, "invoke-record"))[0]
    assert text(browser, "invoke-request-id") in shown.text
    assert browser.find_elements(By.ID, "invoke-log-lines") == []
    assert "Per-call log lines are not available here" in text(browser, "invoke-logs")


WHO = "def handle(event):\n    return {'sub': event['_headers'].get('x-sless-sub')}\n"


def test_invoke_reaches_a_token_trigger_as_the_signed_in_tenant(browser: webdriver.Chrome, sless: SlessProcess,
                                                                  tenant: Tenant) -> None:
    tenant.deploy("private-fn", "python3.11", {"handler.py": WHO}, http=False)
    tenant.api("POST", "/triggers", json={"name": "private-fn", "type": "http", "function": "private-fn",
                                          "auth": "token"}, expect=201)
    assert requests.get(tenant.fn_url("private-fn"), timeout=30).status_code == 401
    sign_in(browser, sless, tenant)
    open_function(browser, "private-fn")
    invoke(browser, "GET", "/", "")
    assert text(browser, "invoke-status") == "200 OK"
    assert json.loads(text(browser, "invoke-body")) == {"sub": tenant.sub}  # verified by the proxy


def test_a_hostile_answer_is_shown_as_text_and_never_runs(browser: webdriver.Chrome, sless: SlessProcess,
                                                          tenant: Tenant) -> None:
    tenant.deploy("beacon", "python3.11", {"handler.py": BEACON})
    tenant.deploy("hostile-fn", "python3.11", {"handler.py": HOSTILE})
    sign_in(browser, sless, tenant)
    open_function(browser, "hostile-fn")
    title = browser.title
    invoke(browser, "GET", f"/?ns={tenant.ns}", "")
    assert text(browser, "invoke-status") == "200 OK"
    shown = browser.find_element(By.ID, "invoke-body").get_attribute("textContent")
    assert shown.startswith("<script>document.title=\"pwned\"") and "onerror=" in shown
    assert "x-hostile: <i>x</i>" in text(browser, "invoke-headers")
    result = browser.find_element(By.ID, "invoke-result")
    assert result.find_elements(By.CSS_SELECTOR, "script, img, b, i") == []
    assert browser.title == title != "pwned"

    invoke(browser, "GET", f"/redirect?ns={tenant.ns}", "")
    assert "does not follow it" in text(browser, "invoke-status")

    # The control: the same answer parsed as HTML does load the beacon, and that is seen within the wait.
    browser.execute_script("""
        const div = document.createElement('div');
        div.innerHTML = arguments[0].replace('/from-answer', '/control');
        document.body.append(div);""", shown)
    deadline = time.monotonic() + WAIT
    while not any(r["path"] == "/control" for r in records(tenant, "beacon")):
        assert time.monotonic() < deadline, "the control never reached the beacon"
        time.sleep(0.2)
    seen = {r["path"] for r in records(tenant, "beacon")}
    assert seen == {"/control"}, seen  # not /from-answer, /from-script or /redirected


def drop_zip(driver: webdriver.Chrome, name: str, data: bytes) -> None:
    """A synthetic drop on the drop zone, carrying a File built from DATA in a DataTransfer."""
    driver.execute_script("""
        const bytes = Uint8Array.from(atob(arguments[1]), (c) => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], arguments[0], { type: 'application/zip' }));
        const zone = document.getElementById('drop-zone');
        for (const type of ['dragenter', 'dragover', 'drop']) {
          zone.dispatchEvent(new DragEvent(type, { dataTransfer: transfer, bubbles: true, cancelable: true }));
        }""", name, base64.b64encode(data).decode())


def forget_status(driver: webdriver.Chrome) -> None:
    """Clear the upload's status before the next action, so a wait sees that action's outcome only."""
    driver.execute_script("const s = document.getElementById('upload-status'); s.textContent = ''; "
                          "s.dataset.phase = '';")


def settled_phase(driver: webdriver.Chrome) -> str:
    status = driver.find_element(By.ID, "upload-status")
    return str(until(driver, lambda d: status.get_attribute("data-phase"), wait=180))


def test_upload_by_drag_and_drop_and_by_the_file_picker(browser: webdriver.Chrome, sless: SlessProcess,
                                                        tenant: Tenant, tmp_path: Path) -> None:
    tenant.deploy("up-fn", "python3.11", {"handler.py": "def handle(event):\n    return 'v1'\n"})
    sign_in(browser, sless, tenant)
    open_function(browser, "up-fn")

    v2 = make_zip({"handler.py": "def handle(event):\n    return 'v2'\n"})
    drop_zip(browser, "v2.zip", v2)
    assert settled_phase(browser) == "Ready"
    assert tenant.api("GET", "/functions/up-fn", expect=200).json()["code_hash"] == hashlib.sha256(v2).hexdigest()
    assert requests.get(tenant.fn_url("up-fn"), timeout=30).text == "v2"
    assert browser.find_element(By.ID, "upload-progress").get_attribute("value") == "1"
    until(browser, lambda d: "return 'v2'" in text(d, "source"))  # the detail re-read the new code

    broken = tmp_path / "broken.zip"
    broken.write_bytes(make_zip({"handler.py": "raise RuntimeError('broken at import')\n"}))
    forget_status(browser)
    browser.find_element(By.ID, "upload-file").send_keys(str(broken))
    assert settled_phase(browser) == "Failed"
    log_tail = browser.find_element(By.ID, "upload-log")
    assert log_tail.is_displayed() and "broken at import" in log_tail.text
    assert "Failed" in text(browser, "upload-status")

    not_a_zip = b"this is not a zip archive"
    garbage = tmp_path / "garbage.zip"
    garbage.write_bytes(not_a_zip)
    api_error = tenant.api("POST", "/functions/up-fn/upload", data=not_a_zip,
                           headers={"Content-Type": "application/zip"}).json()["error"]
    forget_status(browser)
    browser.find_element(By.ID, "upload-file").send_keys(str(garbage))
    until(browser, lambda d: text(d, "upload-status") == api_error)
    assert browser.find_element(By.ID, "upload-status").get_attribute("role") == "alert"

    forget_status(browser)
    drop_zip(browser, "notes.txt", b"text")
    until(browser, lambda d: text(d, "upload-status") == "notes.txt is not a .zip file")


JOB = "def handle(event):\n    return {'doubled': event.get('n', 0) * 2}\n"


def job_cell(driver: webdriver.Chrome, job: str, field: str) -> str:
    """Read in one script: the list is re-rendered while a job runs, so element handles go stale."""
    return str(driver.execute_script(
        "const c = document.querySelector(`tr[data-job='${arguments[0]}'] td[data-field='${arguments[1]}']`);"
        "return c ? c.textContent : '';", job, field))


def test_jobs_create_list_and_run_again(browser: webdriver.Chrome, sless: SlessProcess, tenant: Tenant) -> None:
    tenant.deploy("job-fn", "python3.11", {"handler.py": JOB}, http=False)
    tenant.api("POST", "/jobs", json={"name": "recorded-job", "function": "job-fn", "event": {}, "run_id": 0},
               expect=201)
    sign_in(browser, sless, tenant)
    until(browser, lambda d: job_cell(d, "recorded-job", "phase") == "Recorded")
    open_function(browser, "job-fn")

    def create(name: str, event: str) -> WebElement:
        field = browser.find_element(By.ID, "job-name")
        field.clear()
        field.send_keys(name)
        area = browser.find_element(By.ID, "job-event")
        area.clear()
        area.send_keys(event)
        browser.execute_script("document.getElementById('job-create-status').textContent = '';")
        browser.find_element(By.CSS_SELECTOR, "#job-form button[type=submit]").click()
        return until(browser, lambda d: d.find_element(By.ID, "job-create-status").text and
                     d.find_element(By.ID, "job-create-status"))

    bad = tenant.api("POST", "/jobs", json={"name": "Bad_Name", "function": "job-fn", "event": {}}, expect=400)
    assert create("Bad_Name", "{}").text == bad.json()["error"]
    assert create("fine-name", "{not json").text.startswith("the event is not JSON")
    assert create("double", '{"n": 21}').text == "job double created (run 1)"

    until(browser, lambda d: job_cell(d, "double", "phase") == "Succeeded")
    assert job_cell(browser, "double", "run_id") == "1"
    assert json.loads(job_cell(browser, "double", "message")) == {"doubled": 42}

    browser.find_element(By.CSS_SELECTOR, "tr[data-job='double'] button.run-again").send_keys(Keys.ENTER)
    until(browser, lambda d: job_cell(d, "double", "run_id") == "2")
    until(browser, lambda d: job_cell(d, "double", "phase") == "Succeeded")
    assert text(browser, "jobs-status") == "double: run 2 started"
    api_job = tenant.api("GET", "/jobs/double", expect=200).json()
    assert api_job["run_id"] == 2 and api_job["phase"] == "Succeeded"

    # a job's invocation record has no cold/warm value, and the list says none (it said "warm")
    (run,) = [r for r in records(tenant, "job-fn") if r["trigger"] == "job"][:1]
    assert run["cold"] is None, run
    browser.find_element(By.ID, "refresh").click()
    cell = f"tr[data-invocation='{run['id']}'] td:nth-child(6)"
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, cell))
    assert browser.find_element(By.CSS_SELECTOR, cell).text == ""
    assert browser.find_element(By.CSS_SELECTOR, f"tr[data-invocation='{run['id']}'] td:nth-child(7)").text == "job"


CONSOLE_VALUE = "console-pw-2f8e61d4"


def test_secrets_are_listed_by_name_and_set_from_the_form(browser: webdriver.Chrome, sless: SlessProcess,
                                                          tenant: Tenant) -> None:
    """Set through the form (a new secret, then a replacement), listed by name, keys and version, never by value."""
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/secrets", json={"name": "existing", "data": {"k": "v"}}, expect=201)
    sign_in(browser, sless, tenant)
    until(browser, lambda d: "existing" in text(d, "secret-rows"))

    def save(name: str, key: str, value: str) -> str:
        browser.execute_script("document.getElementById('secret-status').textContent = '';")
        name_box = browser.find_element(By.ID, "secret-name")
        name_box.clear()
        name_box.send_keys(name)
        browser.find_element(By.CSS_SELECTOR, "#secret-pairs .secret-key").send_keys(key)
        browser.find_element(By.CSS_SELECTOR, "#secret-pairs .secret-value").send_keys(value + Keys.ENTER)
        return str(until(browser, lambda d: text(d, "secret-status")))

    assert save("db", "PASSWORD", CONSOLE_VALUE) == "db: version 1"
    assert tenant.api("GET", "/secrets/db", expect=200).json()["keys"] == ["PASSWORD"]
    assert save("db", "TOKEN", CONSOLE_VALUE) == "db: version 2"
    until(browser, lambda d: "TOKEN" in text(d, "secret-rows"))
    assert "existing" in text(browser, "secret-rows") and CONSOLE_VALUE not in browser.page_source
    assert browser.find_element(By.CSS_SELECTOR, "#secret-pairs .secret-value").get_attribute("value") == ""
    assert tenant.api("GET", "/secrets/db", expect=200).json()["keys"] == ["TOKEN"]
    assert "must be a DNS-1123 label" in save("Bad_Name", "K", CONSOLE_VALUE)
    assert [s["name"] for s in tenant.api("GET", "/secrets", expect=200).json()["items"]] == ["db", "existing"]


def test_scaling_is_shown_set_refused_with_the_apis_message_and_removed(browser: webdriver.Chrome,
                                                                         sless: SlessProcess, tenant: Tenant) -> None:
    """The function's scale in words (or fixed replicas) and in the list; the form sets only what is filled in
    (the API keeps the rest), shows a refusal as the API words it, and "Fixed replicas" removes it."""
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "elastic", "runtime": "python3.11",
                                           "scale": {"min": 1, "max": 4, "idle_sec": 60}}, expect=201)
    sign_in(browser, sless, tenant)
    row = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-function='elastic']"))[0]
    assert "1..4" in row.text
    open_function(browser, "elastic")
    until(browser, lambda d: text(d, "scale-current").startswith("1..4 replicas, target 10 calls in flight"))
    assert browser.find_element(By.ID, "scale-idle_sec").get_attribute("value") == "60"

    def submit(**values: str) -> str:
        browser.execute_script("document.getElementById('scale-status').textContent = '';")
        for key in ("min", "max", "target", "idle_sec"):
            box = browser.find_element(By.ID, f"scale-{key}")
            box.clear()
            if key in values:
                box.send_keys(values[key])
        browser.find_element(By.ID, "scale-save").click()
        return str(until(browser, lambda d: text(d, "scale-status")))

    assert submit(max="6", target="3") == ("saved: 1..6 replicas, target 3 calls in flight per replica, back to 1 "
                                           "after 60s without calls")
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] == {
        "min": 1, "max": 6, "target": 3, "idle_sec": 60}
    until(browser, lambda d: "1..6" in d.find_element(By.CSS_SELECTOR, "tr[data-function='elastic']").text)
    refused = tenant.api("PATCH", "/functions/elastic", json={"scale": {"min": 7, "max": 6}}, expect=400).json()
    assert submit(min="7", max="6") == refused["error"]
    assert browser.find_element(By.ID, "scale-status").get_attribute("role") == "alert"

    browser.execute_script("document.getElementById('scale-status').textContent = '';")
    browser.find_element(By.ID, "scale-off").click()
    until(browser, lambda d: text(d, "scale-status") == "scaling removed: fixed replicas")
    assert text(browser, "scale-current") == "fixed replicas (no scale)"
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] is None
    until(browser, lambda d: "fixed" in d.find_element(By.CSS_SELECTOR, "tr[data-function='elastic']").text)


ONE = "def handle(event):\n    return 'one'\n"
TWO = "def handle(event):\n    return 'two'\n"


def version_cells(driver: webdriver.Chrome) -> list[list[str]]:
    """The Versions table as text, read in one script (it is re-rendered after every change)."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll('#version-rows tr')]"
        ".map((r) => [...r.cells].map((c) => c.textContent));"))


def test_versions_split_and_rollback(browser: webdriver.Chrome, sless: SlessProcess, tenant: Tenant) -> None:
    tenant.deploy("canary", "python3.11", {"handler.py": ONE})
    tenant.upload("canary", {"handler.py": TWO})
    two = hashlib.sha256(make_zip({"handler.py": TWO})).hexdigest()
    tenant.wait_phase("canary", ("Ready",), code_hash=two)
    api_versions = tenant.api("GET", "/functions/canary/versions", expect=200).json()["items"]
    sign_in(browser, sless, tenant)
    open_function(browser, "canary")

    until(browser, lambda d: len(version_cells(d)) == 2)
    (v2, v1) = version_cells(browser)
    assert v2[:2] == ["v2", two[:12]] and v2[2] == api_versions[0]["deployed_at"] and v2[4:] == ["-", "current"]
    assert v1[0] == "v1" and v1[4:] == ["-", "Roll back"]
    assert browser.find_elements(By.CSS_SELECTOR, "tr[data-version='2'] button") == []  # no rollback to itself
    assert text(browser, "traffic-current") == "No split: every call goes to the current version (v2)."

    def set_split(weight_a: str, weight_b: str) -> str:
        browser.execute_script("document.getElementById('traffic-status').textContent = '';")
        for key, weight in (("a", weight_a), ("b", weight_b)):
            box = browser.find_element(By.ID, f"traffic-weight-{key}")
            box.clear()
            box.send_keys(weight)
        browser.find_element(By.ID, "traffic-set").click()
        return str(until(browser, lambda d: text(d, "traffic-status")))

    # the form starts at the current version (100) and the one before it (0)
    assert browser.find_element(By.ID, "traffic-version-a").get_attribute("value") == "2"
    assert browser.find_element(By.ID, "traffic-version-b").get_attribute("value") == "1"
    assert set_split("90", "10") == "split set: v2 90%, v1 10%"
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {
        "split": [{"version": 2, "weight": 90}, {"version": 1, "weight": 10}]}
    until(browser, lambda d: [row[4] for row in version_cells(d)] == ["90%", "10%"])
    assert text(browser, "traffic-current") == "v2 90% (current), v1 10%"

    # what the API refuses is shown in its own words; the split in place stays
    refused = tenant.api("PUT", "/functions/canary/traffic", expect=400, json={
        "split": [{"version": 2, "weight": 90}, {"version": 1, "weight": 20}]}).json()["error"]
    assert set_split("90", "20") == refused
    assert browser.find_element(By.ID, "traffic-status").get_attribute("role") == "alert"
    assert set_split("90", "") == "the weight of v1 must be a whole number from 0 to 100"  # nothing sent
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json()["split"][1] == {"version": 1, "weight": 10}

    browser.find_element(By.ID, "traffic-clear").send_keys(Keys.ENTER)
    until(browser, lambda d: text(d, "traffic-status") == "split cleared: every call goes to the current version")
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}
    until(browser, lambda d: [row[4] for row in version_cells(d)] == ["-", "-"])

    # rollback: nothing happens until it is confirmed; then the page follows it until v1's code is current
    assert set_split("50", "50") == "split set: v2 50%, v1 50%"
    until(browser, lambda d: [row[4] for row in version_cells(d)] == ["50%", "50%"])  # re-rendered: rows settled
    rollback = browser.find_element(By.CSS_SELECTOR, "tr[data-version='1'] button.rollback")
    assert rollback.get_attribute("aria-label") == "Roll back to version 1"
    rollback.send_keys(Keys.ENTER)
    dialog = until(browser, lambda d: d.switch_to.alert)
    assert "Roll canary back to version 1?" in dialog.text
    dialog.dismiss()
    until(browser, lambda d: text(d, "versions-status") == "rollback cancelled")
    assert len(tenant.api("GET", "/functions/canary/versions", expect=200).json()["items"]) == 2
    browser.find_element(By.CSS_SELECTOR, "tr[data-version='1'] button.rollback").click()
    until(browser, lambda d: d.switch_to.alert).accept()
    status = browser.find_element(By.ID, "versions-status")
    assert until(browser, lambda d: status.get_attribute("data-phase"), wait=180) == "Ready"
    assert text(browser, "versions-status") == "version 3 is current (the code and configuration of version 1)"
    assert requests.get(tenant.fn_url("canary"), timeout=30).text == "one"
    until(browser, lambda d: [row[0] for row in version_cells(d)] == ["v3", "v2", "v1"])
    assert version_cells(browser)[0][4:] == ["-", "current"]  # a rollback drops the split
    assert text(browser, "traffic-current") == "No split: every call goes to the current version (v3)."
    until(browser, lambda d: "return 'one'" in text(d, "source"))  # the detail re-read the function

    # a refused rollback (the function was deleted meanwhile) shows the API's error and changes nothing
    tenant.api("DELETE", "/functions/canary", expect=204)
    missing = tenant.api("POST", "/functions/canary/rollback", json={"version": 2}, expect=404).json()["error"]
    browser.find_element(By.CSS_SELECTOR, "tr[data-version='2'] button.rollback").click()
    until(browser, lambda d: d.switch_to.alert).accept()
    until(browser, lambda d: text(d, "versions-status") == missing)
    assert status.get_attribute("role") == "alert"
    assert browser.find_element(By.CSS_SELECTOR, "tr[data-version='2'] button.rollback").is_enabled()


def active_id(driver: webdriver.Chrome) -> str:
    return str(driver.switch_to.active_element.get_attribute("id"))


def clear_status(driver: webdriver.Chrome, *element_ids: str) -> None:
    for element_id in element_ids:
        driver.execute_script("document.getElementById(arguments[0]).textContent = '';", element_id)


def test_create_a_function_refusals_next_to_their_field_and_delete_it(browser: webdriver.Chrome,
                                                                      sless: SlessProcess, tenant: Tenant) -> None:
    """The "New function" form creates one and opens it; what the API refuses is shown next to the field it names,
    with the input kept; "Delete function" asks first, then the page goes back to the list."""
    tenant.api("POST", "/ensure", expect=(200, 201))
    sign_in(browser, sless, tenant)

    refused = tenant.api("POST", "/functions", json={"name": "Bad_Name", "runtime": "nodejs20"}, expect=400).json()
    assert refused["field"] == "name"
    fill(browser, "create-name", "Bad_Name")
    browser.find_element(By.ID, "create-runtime").send_keys("nodejs20")
    fill(browser, "create-timeout_sec", "12").send_keys(Keys.ENTER)  # submitted from the keyboard
    until(browser, lambda d: text(d, "create-name-error") == refused["error"])
    name_box = browser.find_element(By.ID, "create-name")
    assert name_box.get_attribute("value") == "Bad_Name" and name_box.get_attribute("aria-invalid") == "true"
    until(browser, lambda d: active_id(d) == "create-name")
    assert text(browser, "create-status") == ""

    too_big = tenant.api("POST", "/functions", expect=400, json={"name": "made-here", "runtime": "nodejs20",
                                                                "memory_mb": 99999, "timeout_sec": 12}).json()
    assert too_big["field"] == "memory_mb"
    fill(browser, "create-name", "made-here")
    fill(browser, "create-memory_mb", "99999").send_keys(Keys.ENTER)
    until(browser, lambda d: text(d, "create-memory_mb-error") == too_big["error"])
    assert text(browser, "create-name-error") == ""  # the earlier refusal is gone
    until(browser, lambda d: active_id(d) == "create-memory_mb")
    assert browser.find_element(By.ID, "create-timeout_sec").get_attribute("value") == "12"

    fill(browser, "create-memory_mb", "256").send_keys(Keys.ENTER)
    until(browser, lambda d: text(d, "create-status") == "function made-here created")
    until(browser, lambda d: text(d, "detail-title").startswith("made-here (nodejs20, "))
    until(browser, lambda d: active_id(d) == "detail-title")
    made = tenant.api("GET", "/functions/made-here", expect=200).json()
    assert (made["runtime"], made["memory_mb"], made["timeout_sec"]) == ("nodejs20", 256, 12)
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-function='made-here']"))
    assert browser.find_element(By.ID, "create-name").get_attribute("value") == ""

    browser.find_element(By.ID, "fn-delete").send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete function made-here?", accept=False)
    until(browser, lambda d: text(d, "detail-status") == "delete cancelled")
    tenant.api("GET", "/functions/made-here", expect=200)

    browser.find_element(By.ID, "fn-delete").send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete function made-here?")
    until(browser, lambda d: text(d, "functions-status") == "function made-here deleted")
    assert not browser.find_element(By.ID, "detail").is_displayed()
    assert browser.find_elements(By.CSS_SELECTOR, "tr[data-function='made-here']") == []
    until(browser, lambda d: active_id(d) == "functions-title")
    tenant.api("GET", "/functions/made-here", expect=404)


ENV = ("import os\ndef handle(event):\n"
       "    return {'greeting': os.environ.get('GREETING'), 'extra': os.environ.get('EXTRA')}\n")


def env_rows(driver: webdriver.Chrome) -> list[list[str]]:
    return list(driver.execute_script(
        "return [...document.querySelectorAll('#settings-env-rows .env-row')]"
        ".map((r) => [r.querySelector('.env-name').value, r.querySelector('.env-value').value]);"))


def test_settings_memory_timeout_concurrency_and_env(browser: webdriver.Chrome, sless: SlessProcess,
                                                     tenant: Tenant) -> None:
    """The form starts from the function; saving sends the fields and the variables as a whole; a refusal is shown
    next to its field and nothing typed is lost."""
    tenant.deploy("tuned", "python3.11", {"handler.py": ENV}, env_vars={"GREETING": "hi"})
    sign_in(browser, sless, tenant)
    open_function(browser, "tuned")
    assert browser.find_element(By.ID, "settings-memory_mb").get_attribute("value") == "128"
    assert browser.find_element(By.ID, "settings-max_concurrency").get_attribute("value") == "0"
    assert env_rows(browser) == [["GREETING", "hi"]]

    def save() -> None:
        clear_status(browser, "settings-status")
        browser.find_element(By.ID, "settings-save").send_keys(Keys.ENTER)

    fill(browser, "settings-memory_mb", "256")
    fill(browser, "settings-timeout_sec", "20")
    fill(browser, "settings-max_concurrency", "5")
    value = browser.find_element(By.CSS_SELECTOR, "#settings-env-rows .env-value")
    value.clear()
    value.send_keys("hello")
    browser.find_element(By.ID, "settings-env-add").send_keys(Keys.ENTER)
    until(browser, lambda d: len(env_rows(d)) == 2)
    new_name = browser.switch_to.active_element  # the new row's name field has the focus
    assert "env-name" in str(new_name.get_attribute("class"))
    new_name.send_keys("EXTRA" + Keys.TAB + "x")
    save()
    until(browser, lambda d: text(d, "settings-status").startswith("saved: 256 MB, 20s timeout, max concurrency 5"))
    fn = tenant.api("GET", "/functions/tuned", expect=200).json()
    assert (fn["memory_mb"], fn["timeout_sec"], fn["max_concurrency"]) == (256, 20, 5)
    assert fn["env_vars"] == {"GREETING": "hello", "EXTRA": "x"}
    tenant.wait_phase("tuned", ("Ready",))
    until(browser, lambda d: requests.get(tenant.fn_url("tuned"), timeout=30).json() ==
          {"greeting": "hello", "extra": "x"})

    # a refusal: next to the field, focused, the form as typed
    refused = tenant.api("PATCH", "/functions/tuned", expect=400, json={"memory_mb": 99999}).json()
    fill(browser, "settings-memory_mb", "99999")
    save()
    until(browser, lambda d: text(d, "settings-memory_mb-error") == refused["error"])
    until(browser, lambda d: active_id(d) == "settings-memory_mb")
    assert browser.find_element(By.ID, "settings-memory_mb").get_attribute("value") == "99999"
    assert browser.find_element(By.ID, "settings-memory_mb-error").get_attribute("role") == "alert"
    assert tenant.api("GET", "/functions/tuned", expect=200).json()["memory_mb"] == 256

    fill(browser, "settings-memory_mb", "256")
    browser.find_element(By.ID, "settings-env-add").send_keys(Keys.ENTER)
    until(browser, lambda d: len(env_rows(d)) == 3)
    browser.switch_to.active_element.send_keys("1BAD" + Keys.TAB + "v")
    bad_env = tenant.api("PATCH", "/functions/tuned", expect=400,
                         json={"env_vars": {"GREETING": "hello", "EXTRA": "x", "1BAD": "v"}}).json()
    save()
    until(browser, lambda d: text(d, "settings-env_vars-error") == bad_env["error"])
    assert text(browser, "settings-memory_mb-error") == ""
    assert env_rows(browser) == [["EXTRA", "x"], ["GREETING", "hello"], ["1BAD", "v"]]  # as the API lists them

    # remove rows by keyboard, then save: the variables are replaced as a whole
    for label in ("Remove variable 3", "Remove variable 1"):
        browser.find_element(By.CSS_SELECTOR, f"button[aria-label='{label}']").send_keys(Keys.ENTER)
    until(browser, lambda d: env_rows(d) == [["GREETING", "hello"]])
    save()
    until(browser, lambda d: text(d, "settings-status").startswith("saved: 256 MB"))
    assert text(browser, "settings-env_vars-error") == ""
    assert tenant.api("GET", "/functions/tuned", expect=200).json()["env_vars"] == {"GREETING": "hello"}


def trigger_items(driver: webdriver.Chrome) -> list[str]:
    return list(driver.execute_script(
        "return [...document.querySelectorAll('#trigger-list li[data-trigger-item]')]"
        ".map((li) => li.textContent.trim());"))


def test_triggers_are_added_and_deleted(browser: webdriver.Chrome, sless: SlessProcess, tenant: Tenant) -> None:
    """http (token) and cron triggers added from the form (the fields of the chosen type only), a refused
    schedule shown next to its field, and a trigger deleted after a confirmation."""
    tenant.deploy("trig-fn", "python3.11", {"handler.py": HELLO}, http=False)
    sign_in(browser, sless, tenant)
    open_function(browser, "trig-fn")
    assert text(browser, "trigger-list") == "(no triggers)"
    assert not browser.find_element(By.ID, "trigger-schedule").is_displayed()

    def add(name: str, kind: str, **fields: str) -> None:
        clear_status(browser, "trigger-status")
        fill(browser, "trigger-name", name)
        browser.find_element(By.ID, "trigger-type").send_keys(kind)
        for key, value in fields.items():
            box = browser.find_element(By.ID, f"trigger-{key}")
            assert box.is_displayed(), key
            if box.tag_name == "select":
                box.send_keys(value)
            else:
                fill(browser, f"trigger-{key}", value)
        browser.find_element(By.ID, "trigger-save").send_keys(Keys.ENTER)

    add("trig-http", "http", auth="token")
    until(browser, lambda d: text(d, "trigger-status") == "trigger trig-http added")
    assert tenant.api("GET", "/triggers/trig-http", expect=200).json()["auth"] == "token"
    focused(browser, "trig-http")
    assert trigger_items(browser) == ["trig-http: http (token) Delete"]
    assert not browser.find_element(By.ID, "trigger-queue").is_displayed()

    refused = tenant.api("POST", "/triggers", expect=400, json={"name": "trig-cron", "type": "cron",
                                                               "function": "trig-fn", "schedule": "every day"}).json()
    assert refused["field"] == "schedule"
    add("trig-cron", "cron", schedule="every day")
    until(browser, lambda d: text(d, "trigger-schedule-error") == refused["error"])
    until(browser, lambda d: active_id(d) == "trigger-schedule")
    assert not browser.find_element(By.ID, "trigger-auth").is_displayed()
    add("trig-cron", "cron", schedule="*/5 * * * *")
    until(browser, lambda d: text(d, "trigger-status") == "trigger trig-cron added")
    assert text(browser, "trigger-schedule-error") == ""
    assert tenant.api("GET", "/triggers/trig-cron", expect=200).json()["schedule"] == "*/5 * * * *"

    # `sless up` without a broker refuses event triggers (the broker's own test adds one: test_console_queues.py);
    # a refusal that names no field of the form is said in its status, as an alert
    no_broker = tenant.api("POST", "/triggers", expect=(400, 422), json={
        "name": "trig-event", "type": "event", "function": "trig-fn", "queue": "orders"}).json()["error"]
    add("trig-event", "event", queue="orders", delivery="at least once")
    until(browser, lambda d: text(d, "trigger-status") == no_broker)
    assert browser.find_element(By.ID, "trigger-status").get_attribute("role") == "alert"
    assert browser.find_element(By.ID, "trigger-queue").get_attribute("value") == "orders"  # kept

    delete = "button[aria-label='Delete trigger trig-http']"
    browser.find_element(By.CSS_SELECTOR, delete).send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete trigger trig-http (http)?", accept=False)
    until(browser, lambda d: text(d, "trigger-status") == "delete cancelled")
    tenant.api("GET", "/triggers/trig-http", expect=200)
    browser.find_element(By.CSS_SELECTOR, delete).send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete trigger trig-http (http)?")
    until(browser, lambda d: text(d, "trigger-status") == "trigger trig-http deleted")
    tenant.api("GET", "/triggers/trig-http", expect=404)
    until(browser, lambda d: [item.split(":")[0] for item in trigger_items(d)] == ["trig-cron"])
    until(browser, lambda d: active_id(d) == "trigger-name")


def test_jobs_and_secrets_are_deleted_after_a_confirmation(browser: webdriver.Chrome, sless: SlessProcess,
                                                           tenant: Tenant) -> None:
    tenant.deploy("job-fn", "python3.11", {"handler.py": JOB}, http=False)
    tenant.api("POST", "/jobs", json={"name": "old-job", "function": "job-fn", "event": {}, "run_id": 0}, expect=201)
    tenant.api("POST", "/secrets", json={"name": "old-secret", "data": {"k": "v"}}, expect=201)
    sign_in(browser, sless, tenant)

    until(browser, lambda d: job_cell(d, "old-job", "phase") == "Recorded")
    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Delete job old-job']").send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete job old-job?", accept=False)
    until(browser, lambda d: text(d, "jobs-status") == "delete cancelled")
    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Delete job old-job']").send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete job old-job?")
    until(browser, lambda d: text(d, "jobs-status") == "job old-job deleted")
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-job='old-job']") == [])
    until(browser, lambda d: active_id(d) == "jobs-title")
    tenant.api("GET", "/jobs/old-job", expect=404)

    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "button[aria-label='Delete secret old-secret']"))
    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Delete secret old-secret']").send_keys(Keys.ENTER)
    accept_dialog(browser, "Delete secret old-secret?")
    until(browser, lambda d: text(d, "secret-status") == "secret old-secret deleted")
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-secret='old-secret']") == [])
    until(browser, lambda d: active_id(d) == "secrets-title")
    tenant.api("GET", "/secrets/old-secret", expect=404)
