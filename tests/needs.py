"""What a test needs from the machine, and what it does without it: skipped on a developer's
machine, failed in CI (which installs everything)."""

from __future__ import annotations

import os

import pytest


def missing(what: str) -> None:
    """Fail in CI (``CI=true``), else skip, saying what is ``missing``."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI must install it)")
    pytest.skip(what)


def need_mosquitto() -> None:
    from edgefl.transport.broker import mosquitto_binary

    if mosquitto_binary() is None:
        missing("mosquitto is not installed")


def need_playwright():
    """Playwright's ``sync_playwright`` (a failure where it is not installed: the browser tests
    must not pass without it)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.fail(f"playwright is not installed (pip install playwright; it is in the [dev] "
                    f"extra): {e}")
    return sync_playwright
