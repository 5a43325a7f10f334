"""What the dashboard's browser tests share: `atoll dashboard` as a process, and Debian's
headless Chromium driven by selenium (scripts/chromium.sh installs both packages)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# the docs' screenshots are rewritten only when asked (ATOLL_SCREENSHOTS=docs); otherwise each
# run leaves its own under build/, and a test run leaves the tracked tree as it was
SHOTS = REPO / ("docs" if os.environ.get("ATOLL_SCREENSHOTS") == "docs" else "build") / "dashboard"


@dataclass
class Dashboard:
    proc: subprocess.Popen
    url: str  # with its one-time token

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def start_dashboard(kit: Path, study: str, home: Path) -> Dashboard:
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ATOLL_HOME": str(home)}
    env.pop("ATOLL_KIT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "atoll", "dashboard", "--kit", str(kit), "--study", study,
         "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # printed once it listens
    found = re.search(r"open (http://\S+)", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"no URL from atoll dashboard: {line!r} {proc.stderr.read()}")
    return Dashboard(proc, found.group(1))


def browser():
    """Headless Chromium: Debian's binary and driver, never one selenium would download."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI") == "true":
            pytest.fail("chromium and chromedriver are missing: run scripts/chromium.sh")
        pytest.skip("chromium and chromedriver are missing: run scripts/chromium.sh")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1100", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def console_errors(driver, allowed: tuple[str, ...] = ()) -> list[str]:
    """The browser console's errors since the last call, less those named in ``allowed``
    (e.g. the 404 the page itself shows for an unknown job)."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def text(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def until(driver, predicate, what: str, timeout: float = 120.0):
    """Wait for the page to show ``what`` (no timing is asserted: the timeout only ends a
    test that would hang)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, 0.1, ignored_exceptions=(
        StaleElementReferenceException,)).until(lambda d: predicate(d), f"page never showed {what}")


def screenshot(driver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
