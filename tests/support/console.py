"""The console's browser tests' shared steps: a headless Chromium per module, bounded waits on what the page
shows, signing in, opening a function, answering a confirm dialog, filling a field."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.browser import headless_chromium
from tests.support.platform import SlessProcess, Tenant

WAIT = 60


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


def until(driver: webdriver.Chrome, check: Callable[[webdriver.Chrome], Any], wait: float = WAIT) -> Any:
    return WebDriverWait(driver, wait, poll_frequency=0.1).until(check)


def focused(driver: webdriver.Chrome, trigger: str, wait: float = WAIT) -> None:
    """Wait until TRIGGER's switch in the function's trigger list has the focus; on a timeout, say what the page
    showed instead (its status lines, the list, the focused element), so a failure tells its cause."""
    try:
        until(driver, lambda d: d.switch_to.active_element.get_attribute("data-trigger") == trigger, wait)
    except TimeoutException:
        active = driver.switch_to.active_element
        shown = {key: text(driver, key) for key in ("detail-status", "trigger-status", "trigger-list")}
        raise AssertionError(f"the switch of trigger {trigger!r} never had the focus: the page showed {shown}, "
                             f"focus on <{active.tag_name} id={active.get_attribute('id')!r}>") from None


def text(driver: webdriver.Chrome, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def sign_in(driver: webdriver.Chrome, sless: SlessProcess, tenant: Tenant) -> None:
    driver.get(f"{sless.url}/console")
    driver.execute_script("sessionStorage.clear();")
    driver.get(f"{sless.url}/console")
    driver.find_element(By.ID, "token").send_keys(tenant.token)
    submit_login(driver)
    until(driver, lambda d: tenant.ns in text(d, "who"))


def submit_login(driver: webdriver.Chrome) -> None:
    """Press "Open console" once the page's script has enabled it (it is disabled until the script handles it)."""
    button = until(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").is_enabled()
                   and d.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]"))
    button.click()


def open_function(driver: webdriver.Chrome, name: str) -> None:
    button = until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"tr[data-function='{name}'] button.link"))[0]
    button.send_keys(Keys.ENTER)  # keyboard, not a mouse click: the list works without a pointer
    until(driver, lambda d: text(d, "detail-title").startswith(f"{name} ("))
    until(driver, lambda d: d.find_element(By.ID, "detail-title") == d.switch_to.active_element)


def accept_dialog(driver: webdriver.Chrome, expected: str, accept: bool = True) -> None:
    dialog = until(driver, lambda d: d.switch_to.alert)
    assert expected in dialog.text, dialog.text
    if accept:
        dialog.accept()
    else:
        dialog.dismiss()


def fill(driver: webdriver.Chrome, element_id: str, value: str) -> WebElement:
    box = driver.find_element(By.ID, element_id)
    box.clear()
    if value:
        box.send_keys(value)
    return box
