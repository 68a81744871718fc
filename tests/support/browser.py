"""Headless Chromium from Debian (the ``chromium`` and ``chromium-driver`` packages) driven through selenium.

scripts/install-test-services.sh installs both; the browser tests share this one way of starting it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def chromium_binaries() -> tuple[str, str]:
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    assert Path(browser).exists() and Path(driver).exists(), \
        "chromium and chromium-driver (Debian) are needed: scripts/install-test-services.sh installs them"
    return browser, driver


@contextmanager
def headless_chromium() -> Iterator[webdriver.Chrome]:
    binary, driver_path = chromium_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()
