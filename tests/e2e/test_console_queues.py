"""The console's event triggers and dead letters in a real browser, on `sless up` with a real broker: an event
trigger added from the form, then the dead letters of its queue listed, one shown (headers and body), one
redriven (and then handled) and one purged after a confirmation, all by keyboard; and the API's 422 (no broker)
said in the panel. Waits are bounded polls on what
the page (or the broker) shows; nothing sleeps for a fixed time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.support.console import accept_dialog, browser, fill, open_function, sign_in, text, until
from tests.support.eventqueues import SWITCHABLE, calls, publish, sless_queues
from tests.support.platform import SlessProcess, Tenant
from tests.support.rabbitmq import RabbitBroker, queue_counts

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq]
__all__ = ["browser", "sless_queues"]  # fixtures shared with the modules they come from

PANEL = "section.dead-letters[data-queue='inbox']"


def dead_letter_rows(driver: webdriver.Chrome) -> list[list[str]]:
    """The panel's rows as text, read in one script (the table is re-rendered after every action)."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map((r) => [...r.cells].map((c) => c.textContent));", PANEL))


def panel_status(driver: webdriver.Chrome) -> str:
    return str(driver.execute_script(
        "const s = document.querySelector(arguments[0] + ' .dl-status'); return s ? s.textContent : '';", PANEL))


def press(driver: webdriver.Chrome, label: str) -> None:
    until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"{PANEL} button[aria-label='{label}']"))
    driver.find_element(By.CSS_SELECTOR, f"{PANEL} button[aria-label='{label}']").send_keys(Keys.ENTER)


def test_dead_letters_are_listed_shown_redriven_and_purged(
        browser: webdriver.Chrome, sless_queues: SlessProcess, rabbitmq_broker: RabbitBroker,
        tmp_path: Path) -> None:
    tenant = Tenant(sless_queues.url, "console-dead-letters")
    tenant.deploy("switchable", "python3.11", {"handler.py": SWITCHABLE}, http=False, timeout_sec=10,
                  env_vars={"OUT_DIR": str(tmp_path)})
    (tmp_path / "fail").touch()
    sign_in(browser, sless_queues, tenant)
    open_function(browser, "switchable")

    fill(browser, "trigger-name", "on-inbox")
    browser.find_element(By.ID, "trigger-type").send_keys("event")
    fill(browser, "trigger-queue", "inbox")
    browser.find_element(By.ID, "trigger-delivery").send_keys("at least once")
    browser.find_element(By.ID, "trigger-save").send_keys(Keys.ENTER)
    until(browser, lambda d: text(d, "trigger-status") == "trigger on-inbox added")
    trigger = tenant.api("GET", "/triggers/on-inbox", expect=200).json()
    assert (trigger["type"], trigger["queue"], trigger["delivery"]) == ("event", "inbox", "at_least_once")
    until(browser, lambda d: panel_status(d) != "")  # the panel read the queue once (perhaps not declared yet)
    title = browser.find_element(By.CSS_SELECTOR, f"{PANEL} h3").text
    assert title == "Dead letters of queue inbox (trigger on-inbox)"

    until(browser, lambda d: queue_counts(rabbitmq_broker, f"{tenant.ns}.inbox")[1] == 1)  # consuming
    press(browser, "Refresh the dead letters of queue inbox")
    until(browser, lambda d: panel_status(d) == "no dead letters")
    for n in range(2):
        publish(tenant, "inbox", json.dumps({"n": n}), **{"Content-Type": "application/json",
                                                          "X-Sless-Message-Id": f"m-{n}"})
    until(browser, lambda d: queue_counts(rabbitmq_broker, f"{tenant.ns}.inbox.dlq")[0] == 2)
    press(browser, "Refresh the dead letters of queue inbox")
    until(browser, lambda d: len(dead_letter_rows(d)) == 2)
    listed = tenant.api("GET", "/queues/inbox/dead-letters", expect=200).json()["items"]
    for row, item in zip(dead_letter_rows(browser), listed, strict=True):
        assert row[:5] == [item["failed_at"], "failed", item["reason"], str(item["attempts"]), item["message_id"]]
        assert "switched to fail" in row[2]
    assert panel_status(browser) == "2 dead letter(s)"

    press(browser, "Show dead letter m-0")
    view = f"{PANEL} .dl-view"
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{view} pre.dl-body"))
    assert json.loads(browser.find_element(By.CSS_SELECTOR, f"{view} pre.dl-body").text) == {"n": 0}
    (first,) = [item for item in listed if item["message_id"] == "m-0"]
    shown = tenant.api("GET", f"/queues/inbox/dead-letters/{first['id']}", expect=200).json()
    headers = browser.find_element(By.CSS_SELECTOR, f"{view} dl.dl-headers").text
    assert all(name in headers for name in shown["headers"]), (headers, shown["headers"])
    seen = browser.find_element(By.CSS_SELECTOR, f"{view} dl.dl-seen").text
    assert shown["first_seen_at"] in seen and shown["failed_at"] in seen  # first and last seen
    until(browser, lambda d: d.switch_to.active_element == d.find_element(By.CSS_SELECTOR, view))

    (tmp_path / "fail").unlink()
    press(browser, "Redrive dead letter m-0")
    until(browser, lambda d: panel_status(d) == "redriven: 1")
    until(browser, lambda d: [row[4] for row in dead_letter_rows(d)] == ["m-1"])
    until(browser, lambda d: [c["data"] for c in calls(tmp_path)] == [{"n": 0}])  # handled this time
    until(browser, lambda d: d.switch_to.active_element == d.find_element(By.CSS_SELECTOR, f"{PANEL} h3"))

    press(browser, "Purge dead letter m-1")
    accept_dialog(browser, "Purge dead letter m-1 of queue inbox?", accept=False)
    until(browser, lambda d: panel_status(d) == "purge cancelled")
    assert len(tenant.api("GET", "/queues/inbox/dead-letters", expect=200).json()["items"]) == 1
    press(browser, "Purge dead letter m-1")
    accept_dialog(browser, "Purge dead letter m-1 of queue inbox?")
    until(browser, lambda d: panel_status(d) == "purged: 1")
    assert dead_letter_rows(browser) == []
    assert tenant.api("GET", "/queues/inbox/dead-letters", expect=200).json()["items"] == []
    assert [c["data"] for c in calls(tmp_path)] == [{"n": 0}]  # a purged message never runs

    # Where the platform has no broker the API answers 422 (and `sless up` without one refuses event triggers, so
    # no panel exists there): simulated in the page, a fetch wrapper answering 422 for the dead-letter routes only.
    no_broker = "event queues need a broker: this platform has no SLESS_RABBITMQ_URL"
    browser.execute_script("""
        const real = window.fetch;
        window.fetch = (url, init) => /\\/queues\\/[^/]+\\/dead-letters/.test(String(url))
          ? Promise.resolve(new Response(JSON.stringify({ error: arguments[0] }), { status: 422 }))
          : real(url, init);""", no_broker)
    press(browser, "Refresh the dead letters of queue inbox")
    until(browser, lambda d: panel_status(d) == no_broker)
    status = browser.find_element(By.CSS_SELECTOR, f"{PANEL} .dl-status")
    assert status.get_attribute("role") == "alert"
    assert not browser.find_element(By.CSS_SELECTOR, f"{PANEL} table").is_displayed()
