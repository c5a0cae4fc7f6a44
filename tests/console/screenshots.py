"""Regenerate the console's screenshots in docs/img with the browser tests' own harness.

Run by hand from the repository's root: ``python -m tests.console.screenshots``. It starts a real
``ctrlrun serve`` on a throwaway store, makes a few protected calls that wait for a human, signs
in, and saves the queue (``docs/img/console-queue.png``) and one request's page
(``docs/img/console-request.png``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ._browser import Console, Project, add_user, browser_missing, login, start_driver

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
PASSWORD = "a password for the screenshots"
REQUESTS = (
    ({"payment_id": "pi_3QK7", "amount": 450_000, "note": "order 1043 arrived damaged"}, "customer-118"),
    ({"payment_id": "pi_3QL2", "amount": 120_000, "note": "duplicate charge"}, "customer-240"),
    ({"payment_id": "pi_3QM9", "amount": 75_000, "note": "late delivery, goodwill"}, "customer-77"),
)


def _page_height(driver: object) -> int:
    height: int = driver.execute_script(  # type: ignore[attr-defined]
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight);")
    return max(height, 400)


def _shoot(driver: object, url: str, target: Path) -> None:
    """Load ``url`` and save the whole page at the browser's width."""
    driver.get(url)  # type: ignore[attr-defined]
    driver.set_window_size(1280, _page_height(driver) + 40)  # type: ignore[attr-defined]
    driver.save_screenshot(str(target))  # type: ignore[attr-defined]
    print(f"wrote {target}")


def main() -> int:
    """Take both screenshots; exit 1 naming the packages when the browser is missing."""
    missing = browser_missing()
    if missing is not None:
        print(f"cannot take the screenshots: {missing}", file=sys.stderr)
        return 1
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ctrlrun-screenshots-") as scratch:
        project = Project(Path(scratch) / "project")
        ids = [project.request(arguments, user=user) for arguments, user in REQUESTS]
        users = project.directory / "users.yaml"
        add_user(users, "ada", PASSWORD)
        console = Console(project, users)
        driver = start_driver(Path(scratch) / "profile")
        try:
            login(driver, console, "ada", PASSWORD)
            _shoot(driver, console.url("/"), DOCS_IMG / "console-queue.png")
            _shoot(driver, console.url(f"/requests/{ids[0]}"), DOCS_IMG / "console-request.png")
        finally:
            driver.quit()
            console.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
