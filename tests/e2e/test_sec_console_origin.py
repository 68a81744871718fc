"""A function's page cannot read the console's token, though both come from the same host.

Real Chromium (Debian's, through its chromedriver): the console's tab holds the tenant's token in
sessionStorage; the same tab then opens a hostile function's page, whose script tries to read it. With
the default ``Content-Security-Policy: sandbox ...`` on function responses the page has an opaque origin
and storage access throws. The control run, with the policy switched off, shows the attack is real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.browser import headless_chromium
from tests.support.platform import SlessProcess, Tenant, running_sless

pytestmark = pytest.mark.e2e

HOSTILE_PAGE = """
PAGE = '''<!doctype html><html><head><title>pending</title></head><body><script>
let result;
try { result = 'token:' + (sessionStorage.getItem('sless-token') || 'none'); }
catch (e) { result = 'blocked:' + e.name; }
document.title = result;
</script></body></html>'''

def handle(event):
    return {'statusCode': 200, 'headers': {'Content-Type': 'text/html'}, 'body': PAGE}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


def title_after_attack(driver: webdriver.Chrome, platform_url: str, tenant: Tenant) -> str:
    """Log the console in (token in its tab's sessionStorage), then open the function's page in that tab."""
    tenant.deploy("hostile-page", "python3.11", {"handler.py": HOSTILE_PAGE})
    driver.get(f"{platform_url}/console")
    driver.execute_script("sessionStorage.setItem('sless-token', arguments[0]);", tenant.token)
    assert driver.execute_script("return sessionStorage.getItem('sless-token');") == tenant.token
    driver.get(tenant.fn_url("hostile-page"))
    WebDriverWait(driver, 90).until(lambda d: d.title != "pending" and d.title != "")
    return str(driver.title)


def test_a_function_page_cannot_read_the_console_token(browser: webdriver.Chrome, sless: SlessProcess,
                                                       tenant: Tenant) -> None:
    title = title_after_attack(browser, sless.url, tenant)
    assert title == "blocked:SecurityError"
    assert tenant.token not in title


def test_without_the_sandbox_the_same_page_reads_it(browser: webdriver.Chrome, tmp_path: Path) -> None:
    """The control: this is the attack the default policy stops (operators who turn it off need a functions host)."""
    with running_sless(tmp_path / "no-csp", {"SLESS_FUNCTION_CSP": ""}) as open_platform:
        tenant = Tenant(open_platform.url, "console-control")
        title = title_after_attack(browser, open_platform.url, tenant)
    assert title == f"token:{tenant.token}"

