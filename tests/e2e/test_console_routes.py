"""The console's add-trigger form for an http trigger's allowed methods and CORS settings, in a real browser
(Debian's headless Chromium) against a real `sless up`: what the form sends is what the API keeps, what a call
through /fn then meets (405 for a method not allowed, the platform's answer to a CORS preflight), and a refusal
shown in the API's own words next to its field, creating nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.support import cors
from tests.support.console import browser, fill, focused, open_function, sign_in, text, until
from tests.support.platform import SlessProcess, Tenant

pytestmark = pytest.mark.e2e
__all__ = ["browser"]  # the module's fixture, from tests.support.console
APP = "https://app.example"
COUNTER = """
calls = []

def handle(event):
    calls.append(event["_method"])
    return {"calls": calls}
"""
#: The form's text fields of an http trigger's CORS settings, by the API's name.
CORS_FIELDS = ("origins", "headers", "max_age")


def trigger_items(driver: webdriver.Chrome) -> list[str]:
    return list(driver.execute_script(
        "return [...document.querySelectorAll('#trigger-list li[data-trigger-item]')]"
        ".map((li) => li.textContent.trim());"))


def active_id(driver: webdriver.Chrome) -> str:
    return str(driver.switch_to.active_element.get_attribute("id"))


def check(driver: webdriver.Chrome, element_id: str, on: bool = True) -> None:
    """Set a checkbox from the keyboard (space toggles it)."""
    box = driver.find_element(By.ID, element_id)
    assert box.is_displayed(), element_id
    if box.is_selected() != on:
        box.send_keys(Keys.SPACE)
    until(driver, lambda d: box.is_selected() == on)


def add_http(driver: webdriver.Chrome, name: str, methods: tuple[str, ...] = (), cors_methods: tuple[str, ...] = (),
             credentials: bool = False, path: str = "", **cors: str) -> None:
    """Fill the add-trigger form for an http trigger (the CORS text fields by their API name) and submit it."""
    driver.execute_script("document.getElementById('trigger-status').textContent = '';")
    fill(driver, "trigger-name", name)
    driver.find_element(By.ID, "trigger-type").send_keys("http")
    fill(driver, "trigger-path", path)
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        check(driver, f"trigger-methods-{method}", method in methods)
        check(driver, f"trigger-cors-methods-{method}", method in cors_methods)
    check(driver, "trigger-cors-credentials", credentials)
    for field in CORS_FIELDS:
        fill(driver, f"trigger-cors-{field}", cors.get(field, ""))
    driver.find_element(By.ID, "trigger-save").send_keys(Keys.ENTER)


def refusal(tenant: Tenant, body: dict[str, Any]) -> dict[str, Any]:
    """The API's own 400 for BODY, to compare with what the page shows."""
    answer = tenant.api("POST", "/triggers", expect=400, json=body).json()
    assert isinstance(answer, dict)
    return answer


def test_methods_and_cors_from_the_form_reach_the_api_and_the_functions_url(browser: webdriver.Chrome,
                                                                            sless: SlessProcess,
                                                                            tenant: Tenant) -> None:
    tenant.deploy("routed-fn", "python3.11", {"handler.py": COUNTER}, http=False)
    sign_in(browser, sless, tenant)
    open_function(browser, "routed-fn")
    assert text(browser, "trigger-list") == "(no triggers)"
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('#trigger-methods input, #trigger-cors input')]"
        ".filter((i) => !i.labels.length).map((i) => i.id);")
    assert unlabelled == []  # every field is named by its label

    base = {"name": "routed", "type": "http", "function": "routed-fn", "auth": "public"}
    # an origin that is not one: the API's message next to the origins field, which gets the focus
    bad_origin = refusal(tenant, {**base, "methods": ["GET", "POST"], "cors": {"origins": ["not", "a", "url"]}})
    assert bad_origin["field"] == "cors.origins"
    add_http(browser, "routed", methods=("GET", "POST"), origins="not a url")
    until(browser, lambda d: text(d, "trigger-cors-origins-error") == bad_origin["error"])
    until(browser, lambda d: active_id(d) == "trigger-cors-origins")
    assert browser.find_element(By.ID, "trigger-cors-origins").get_attribute("aria-invalid") == "true"
    assert browser.find_element(By.ID, "trigger-cors-origins").get_attribute("value") == "not a url"  # kept
    assert text(browser, "trigger-status") == ""

    # a max age out of range: next to its own field; the earlier refusal is gone
    bad_age = refusal(tenant, {**base, "cors": {"origins": [APP], "max_age": 99999}})
    assert bad_age["field"] == "cors.max_age"
    add_http(browser, "routed", methods=("GET", "POST"), origins=APP, max_age="99999")
    until(browser, lambda d: text(d, "trigger-cors-max_age-error") == bad_age["error"])
    until(browser, lambda d: active_id(d) == "trigger-cors-max_age")
    assert text(browser, "trigger-cors-origins-error") == ""
    assert browser.find_element(By.ID, "trigger-cors-origins").get_attribute("aria-invalid") is None

    # CORS settings without an origin: the origins are still sent (empty), and the API says they are needed
    no_origin = refusal(tenant, {**base, "cors": {"origins": [], "credentials": True}})
    assert no_origin["field"] == "cors.origins"
    add_http(browser, "routed", credentials=True)
    until(browser, lambda d: text(d, "trigger-cors-origins-error") == no_origin["error"])

    # credentials with any origin: refused next to the credentials checkbox
    any_origin = refusal(tenant, {**base, "cors": {"origins": ["*"], "credentials": True}})
    assert any_origin["field"] == "cors.credentials"
    add_http(browser, "routed", credentials=True, origins="*")
    until(browser, lambda d: text(d, "trigger-cors-credentials-error") == any_origin["error"])
    until(browser, lambda d: active_id(d) == "trigger-cors-credentials")

    # none of them created anything, and the page still works
    assert tenant.api("GET", "/triggers", expect=200).json()["items"] == []
    tenant.api("GET", "/triggers/routed", expect=404)
    assert text(browser, "trigger-list") == "(no triggers)"

    add_http(browser, "routed", methods=("GET", "POST"), cors_methods=("GET", "POST"), credentials=True,
             origins=APP, headers="X-Token", max_age="120")
    until(browser, lambda d: text(d, "trigger-status") == "trigger routed added")
    assert text(browser, "trigger-cors-credentials-error") == ""
    focused(browser, "routed")
    # the list is redrawn after the status says the trigger was added
    until(browser, lambda d: trigger_items(d) == [f"routed: http (methods GET, POST) (CORS {APP}) Delete"])
    # the form is empty again for the next trigger
    assert browser.find_element(By.ID, "trigger-cors-origins").get_attribute("value") == ""
    assert not browser.find_element(By.ID, "trigger-methods-GET").is_selected()

    stored = tenant.api("GET", "/triggers/routed", expect=200).json()
    assert stored["methods"] == ["GET", "POST"]
    assert stored["cors"] == {"origins": [APP], "methods": ["GET", "POST"], "headers": ["x-token"],
                              "credentials": True, "max_age": 120}

    url = tenant.fn_url("routed-fn")
    refused = requests.put(url, json={}, timeout=30)
    assert refused.status_code == 405 and refused.headers["Allow"] == "GET, POST", refused.text
    cors.assert_allowed(cors.preflight(url, APP), APP, 120)
    called = requests.post(url, json={}, headers={"Origin": APP}, timeout=30)
    assert called.status_code == 200 and called.json() == {"calls": ["POST"]}  # the refused PUT never ran
    assert called.headers["Access-Control-Allow-Origin"] == APP


def test_an_http_trigger_with_the_fields_left_empty_sends_neither(browser: webdriver.Chrome, sless: SlessProcess,
                                                                 tenant: Tenant) -> None:
    """Nothing filled: no methods and no CORS in the request, so every method reaches the function; the CORS
    fields are only the http type's."""
    tenant.deploy("open-fn", "python3.11", {"handler.py": COUNTER}, http=False)
    sign_in(browser, sless, tenant)
    open_function(browser, "open-fn")
    add_http(browser, "open")
    until(browser, lambda d: text(d, "trigger-status") == "trigger open added")
    stored = tenant.api("GET", "/triggers/open", expect=200).json()
    assert stored["methods"] is None and stored["cors"] is None
    until(browser, lambda d: trigger_items(d) == ["open: http Delete"])  # redrawn after the status
    assert requests.put(tenant.fn_url("open-fn"), json={}, timeout=30).json() == {"calls": ["PUT"]}

    # a path pattern: a bad one refused next to its field, a good one served with its own rules beside "open"
    bad_path = refusal(tenant, {"name": "orders", "type": "http", "function": "open-fn", "auth": "public",
                                "path": "/orders/{id"})
    assert bad_path["field"] == "path"
    add_http(browser, "orders", path="/orders/{id")
    until(browser, lambda d: text(d, "trigger-path-error") == bad_path["error"])
    until(browser, lambda d: active_id(d) == "trigger-path")
    add_http(browser, "orders", methods=("GET",), path="/orders/{id}")
    until(browser, lambda d: text(d, "trigger-status") == "trigger orders added")
    assert tenant.api("GET", "/triggers/orders", expect=200).json()["path"] == "/orders/{id}"
    until(browser, lambda d: trigger_items(d) == ["open: http Delete", "orders: http (path /orders/{id}) "
                                                  "(methods GET) Delete"])
    assert browser.find_element(By.ID, "trigger-path").get_attribute("value") == ""
    assert requests.put(tenant.fn_url("open-fn", "/orders/7"), json={}, timeout=30).status_code == 405
    assert requests.put(tenant.fn_url("open-fn", "/other"), json={}, timeout=30).status_code == 200

    browser.find_element(By.ID, "trigger-type").send_keys("cron")
    until(browser, lambda d: not d.find_element(By.ID, "trigger-cors-origins").is_displayed())
    assert not browser.find_element(By.ID, "trigger-methods-GET").is_displayed()
    assert not browser.find_element(By.ID, "trigger-path").is_displayed()
