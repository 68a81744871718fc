"""A function's Charts panel in a real browser (Debian's headless Chromium), against a real `sless up`.

The panel draws, from the function's recent invocation records, the calls per interval split by outcome, p50 and
p99 latency, and a summary. The test makes real calls through `/fn` (some that fail with 500), then checks what
the panel says and draws against the API's own records: the counts on the bars, the errors, p50 and p99 (nearest
rank over duration_ms), the charts' text equivalents, the empty state, the Refresh button and an API error shown
in the panel. Waits are bounded polls on what the page (or the API) shows; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.support.console import browser, open_function, sign_in, text, until
from tests.support.platform import SlessProcess, Tenant

pytestmark = pytest.mark.e2e
__all__ = ["browser"]  # the module's fixture, from tests.support.console

FAILS_ON_ASK = """
def handle(event):
    if event.get('fail'):
        raise ValueError('asked to fail')
    return {'ok': True}
"""


def records(tenant: Tenant, name: str) -> list[dict[str, Any]]:
    return list(tenant.api("GET", f"/functions/{name}/invocations?limit=500", expect=200).json()["items"])


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def shown_ms(summary: str, label: str) -> float:
    """The number after LABEL in the summary ("p50 1.2 ms")."""
    words = summary.replace(",", "").split()
    return float(words[words.index(label) + 1])


def counts(driver: webdriver.Chrome, selector: str) -> list[int]:
    return [int(n) for n in driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((n) => n.getAttribute('data-count'));", selector)]


def test_charts_count_the_calls_and_their_latency(browser: webdriver.Chrome, sless: SlessProcess,
                                                 tenant: Tenant) -> None:
    tenant.deploy("charted", "python3.11", {"handler.py": FAILS_ON_ASK})
    sign_in(browser, sless, tenant)
    open_function(browser, "charted")
    until(browser, lambda d: text(d, "charts-summary") == "no calls yet")
    assert browser.find_elements(By.CSS_SELECTOR, "#charts svg") == []

    for n in range(10):
        resp = requests.post(tenant.fn_url("charted"), json={"fail": n in (3, 7)}, timeout=60)
        assert resp.status_code == (500 if n in (3, 7) else 200), resp.text
    until(browser, lambda d: len(records(tenant, "charted")) == 10)
    items = records(tenant, "charted")
    browser.find_element(By.ID, "charts-refresh").send_keys(Keys.ENTER)  # by keyboard
    summary = until(browser, lambda d: d.find_element(By.ID, "charts-summary").get_attribute("data-calls") == "10"
                    and d.find_element(By.ID, "charts-summary"))
    shown = summary.text
    assert shown.startswith("10 calls, 2 errors (20.0%), "), shown
    cold = sum(1 for r in items if r["cold"] is True)
    assert f"{cold} cold start{'' if cold == 1 else 's'}," in shown and summary.get_attribute("data-cold") == str(cold)
    assert text(browser, "charts-status") == ""

    durations = [float(r["duration_ms"]) for r in items]
    p50, p99 = nearest_rank(durations, 50), nearest_rank(durations, 99)
    assert float(summary.get_attribute("data-p50")) == p50 and float(summary.get_attribute("data-p99")) == p99
    assert abs(shown_ms(shown, "p50") - p50) <= 0.05 + 1e-9 and abs(shown_ms(shown, "p99") - p99) <= 0.05 + 1e-9

    # The bars: their counts add up to the calls, the red ones to the 5xx.
    assert sum(counts(browser, "#charts rect.bar")) == 10
    assert sum(counts(browser, "#charts rect.bar-error")) == 2
    assert len(browser.find_elements(By.CSS_SELECTOR, "#charts g.bucket")) <= 21
    # The latency chart: a point per interval with calls, the per-interval p99s reaching the overall one.
    p99s = [float(v) for v in browser.execute_script(
        "return [...document.querySelectorAll('#charts circle.point-p99')].map((n) => n.getAttribute('data-p99'));")]
    assert p99s and max(p99s) == p99
    assert len(browser.find_elements(By.CSS_SELECTOR, "#charts polyline.line-p50")) == 1

    # Both charts are images whose label states the numbers; a hidden table holds them per interval.
    calls_svg = browser.find_element(By.CSS_SELECTOR, "#charts svg.chart-calls")
    latency_svg = browser.find_element(By.CSS_SELECTOR, "#charts svg.chart-latency")
    assert calls_svg.get_attribute("role") == latency_svg.get_attribute("role") == "img"
    assert "10 calls, 2 errors" in calls_svg.get_attribute("aria-label")
    p50_text, p99_text = shown.split("p50 ")[1].split(",")[0], shown.split("p99 ")[1]
    assert f"p50 {p50_text}, p99 {p99_text}" in latency_svg.get_attribute("aria-label")
    cells = browser.execute_script(
        "return [...document.querySelectorAll('#charts-table tbody tr')].map((r) => [...r.cells].map((c) => "
        "c.textContent));")
    assert sum(int(row[1]) for row in cells) == 10 and sum(int(row[2]) for row in cells) == 2


def test_charts_say_the_apis_error(browser: webdriver.Chrome, sless: SlessProcess, tenant: Tenant) -> None:
    """An API failure of the listing (simulated in the page: a fetch wrapper answering 503 for it) is said in the
    panel, and the charts drawn before are gone."""
    tenant.deploy("charted", "python3.11", {"handler.py": FAILS_ON_ASK})
    assert requests.post(tenant.fn_url("charted"), json={}, timeout=60).status_code == 200
    until(browser, lambda d: len(records(tenant, "charted")) == 1)
    sign_in(browser, sless, tenant)
    open_function(browser, "charted")
    until(browser, lambda d: text(d, "charts-summary").startswith("1 call, 0 errors (0.0%)"))
    assert sum(counts(browser, "#charts rect.bar")) == 1
    browser.execute_script("""
        const real = window.fetch;
        window.fetch = (url, init) => /\\/invocations\\?limit=500$/.test(String(url))
          ? Promise.resolve(new Response('{"error": "the invocation log is unavailable"}', { status: 503 }))
          : real(url, init);""")
    browser.find_element(By.ID, "charts-refresh").click()
    until(browser, lambda d: text(d, "charts-status") == "the invocation log is unavailable")
    status = browser.find_element(By.ID, "charts-status")
    assert status.get_attribute("role") == "alert" and "error" in status.get_attribute("class")
    assert browser.find_elements(By.CSS_SELECTOR, "#charts svg") == [] and text(browser, "charts-summary") == ""
