"""The console's real-browser harness: Debian's chromium driven by Selenium, a real
``ctrlrun serve`` subprocess, a real agent process, and a store the test reads directly.

No browser is ever downloaded: the harness uses ``/usr/bin/chromium`` and
``/usr/bin/chromedriver`` and skips (fails under ``CI``) when either or Selenium is missing.
The tests and ``python -m tests.console.screenshots`` share it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ctrlrun

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver"
AGENT = Path(__file__).with_name("agent.py")
SOURCE = Path(ctrlrun.__file__).resolve().parent.parent  # the ctrlrun under test, for subprocesses
START_TIMEOUT = 30.0  # seconds for `ctrlrun serve` to name its port (a real process starting)
WAIT = 20.0  # seconds Selenium waits for a page the console is serving

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 500000 }
        decision: approve
      - decision: deny
"""

_CTRLRUN_VARIABLES = ("CTRLRUN_CONFIG", "CTRLRUN_STATE", "CTRLRUN_STORE_URL", "CTRLRUN_ENVIRONMENT",
                      "CTRLRUN_CONSOLE_SECRET")  # fmt: skip
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


def browser_missing() -> str | None:
    """Why the real browser cannot run here (naming the packages to install), or None."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        return f"{' and '.join(missing)} not found: install them with `{INSTALL}`"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    return None


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_browser() -> None:
    """Skip the calling test when the browser is missing; under ``CI`` fail it instead."""
    import pytest

    reason = browser_missing()
    if reason is None:
        return
    if _under_ci():
        pytest.fail(f"{reason}; under CI the browser tests must run", pytrace=False)
    pytest.skip(reason)


def start_driver(profile: Path, *, width: int = 1280, height: int = 900) -> Any:
    """A headless chromium with its own profile directory, driven by the system chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
                     f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT)
    return driver


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without CTRLRUN_* settings, running the ctrlrun under test."""
    env = {k: v for k, v in os.environ.items() if k not in _CTRLRUN_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


class Project:
    """A directory with a policy, a SQLite store and a counter file the agent appends to."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.policy = directory / "ctrlrun.yaml"
        self.policy.write_text(POLICY, encoding="utf-8")
        self.db = directory / ".ctrlrun" / "state.db"
        self.counter = directory / "runs.jsonl"
        self.counter.touch()
        from ctrlrun import SQLiteStateStore

        SQLiteStateStore(self.db).close()  # the library creates the store; the console never does

    @property
    def store_url(self) -> str:
        return f"sqlite://{self.db}"

    def env(self) -> dict[str, str]:
        return environment(CTRLRUN_CONFIG=str(self.policy), CTRLRUN_STATE=str(self.db))

    def agent(self, arguments: dict[str, Any], *, agent: str = "support-agent", user: str | None = None,
              approval: str | None = None, lose_reply: bool = False) -> dict[str, Any]:  # fmt: skip
        """Run the protected call in its own process; its one-line JSON outcome."""
        command = [sys.executable, str(AGENT), "--arguments", json.dumps(arguments),
                   "--counter", str(self.counter), "--agent", agent]  # fmt: skip
        if user is not None:
            command += ["--user", user]
        if approval is not None:
            command += ["--approval", approval]
        if lose_reply:
            command.append("--lose-reply")
        done = subprocess.run(command, cwd=self.directory, env=self.env(), capture_output=True,
                              text=True, encoding="utf-8", timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return outcome

    def request(self, arguments: dict[str, Any], **options: Any) -> str:
        """A protected call the policy sends to a human; the pending request's id."""
        outcome = self.agent(arguments, **options)
        assert outcome["outcome"] == "approval_required", outcome
        request_id: str = outcome["request_id"]
        return request_id

    def runs(self, payment_id: str | None = None) -> list[dict[str, Any]]:
        """Every time the refund's body ran (for one payment, when given)."""
        lines = self.counter.read_text(encoding="utf-8").splitlines()
        runs = [json.loads(line) for line in lines if line.strip()]
        return [r for r in runs if payment_id is None or r["payment_id"] == payment_id]

    @contextmanager
    def store(self) -> Iterator[Any]:
        """The store as it is now, opened in this process without migrating it."""
        from ctrlrun import SQLiteStateStore

        store = SQLiteStateStore(self.db, migrate=False)
        try:
            yield store
        finally:
            store.close()

    def events(self, kind: str | None = None, approval_id: str | None = None) -> list[Any]:
        """The store's events, of one type and one request when given."""
        with self.store() as store:
            events = list(store.events())
        return [e for e in events if (kind is None or str(e.type) == kind)
                and (approval_id is None or e.approval_id == approval_id)]  # fmt: skip


def add_user(users: Path, name: str, password: str) -> None:
    """``ctrlrun serve adduser NAME --users USERS``, the password and its confirmation on stdin."""
    done = subprocess.run([sys.executable, "-m", "ctrlrun", "serve", "adduser", name, "--users", str(users)],
                          input=f"{password}\n{password}\n", env=environment(), capture_output=True,
                          text=True, encoding="utf-8", timeout=60)  # fmt: skip
    assert done.returncode == 0, f"adduser {name}: {done.stderr}"


class Console:
    """A running ``ctrlrun serve`` subprocess on a port of its own choosing."""

    def __init__(self, project: Project, users: Path) -> None:
        self.project = project
        self.log = project.directory / "console.log"
        command = [sys.executable, "-m", "ctrlrun", "serve", "--listen", "127.0.0.1:0",
                   "--users", str(users), "--store-url", project.store_url]  # fmt: skip
        with self.log.open("w", encoding="utf-8") as log:
            self.process = subprocess.Popen(command, cwd=project.directory, env=project.env(),
                                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            self.base = self._listening()
        except BaseException:
            self.stop()
            raise

    def _listening(self) -> str:
        """The URL from the start-up line; the process is real, so poll its log until a deadline."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            found = _LISTENING.search(self.log.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"ctrlrun serve did not say where it listens:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def url(self, path: str) -> str:
        return self.base + path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# --------------------------------------------------------------------------- in the browser


def wait_until(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT).until(condition, message=what)


def left_the_document(element: Any) -> Any:
    """A wait condition: ``element`` is gone, the page it was on replaced. Like selenium's
    ``staleness_of``, but also taking Chromium's answer while it is mid-navigation (the node
    "does not belong to the document"), which ``staleness_of`` raises instead of waiting."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def gone(_driver: Any) -> bool:
        try:
            element.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    return gone


def submit(driver: Any, button: Any) -> None:
    """Click a form's button and wait for the page it leads to."""
    from selenium.webdriver.common.by import By

    page = driver.find_element(By.TAG_NAME, "html")
    button.click()
    wait_until(driver, left_the_document(page), "the answer's page to load")


def path_of(driver: Any) -> str:
    return str(urllib.parse.urlsplit(driver.current_url).path)


def login(driver: Any, console: Console, name: str, password: str) -> None:
    """Sign in through the login form (a fresh session: the browser's cookies are dropped first)."""
    from selenium.webdriver.common.by import By

    driver.get(console.url("/login"))
    driver.delete_all_cookies()
    driver.get(console.url("/login"))
    driver.find_element(By.NAME, "username").send_keys(name)
    field = driver.find_element(By.NAME, "password")
    field.send_keys(password)
    page = driver.find_element(By.TAG_NAME, "html")
    field.submit()
    wait_until(driver, left_the_document(page), "the login's answer")


def action_button(driver: Any, action: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'[data-action="{action}"]')


def form_fields(form: Any) -> dict[str, str]:
    """The named fields of a form in the page, as the browser would send them."""
    from selenium.webdriver.common.by import By

    fields: dict[str, str] = {}
    for element in form.find_elements(By.CSS_SELECTOR, "input[name], textarea[name]"):
        fields[element.get_attribute("name")] = element.get_attribute("value") or ""
    return fields


def logout_form(driver: Any) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, 'form[method="post"][action="/logout"]')


def hidden_fields(form: Any) -> dict[str, str]:
    """The hidden inputs of a form (the session's CSRF token among them)."""
    from selenium.webdriver.common.by import By

    return {e.get_attribute("name"): e.get_attribute("value") or ""
            for e in form.find_elements(By.CSS_SELECTOR, 'input[type="hidden"][name]')}  # fmt: skip


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def post_as(driver: Any, url: str, fields: dict[str, str]) -> tuple[int, str]:
    """A plain HTTP form POST carrying the browser's session cookie: its status and body."""
    cookies = "; ".join(f"{c['name']}={c['value']}" for c in driver.get_cookies())
    request = urllib.request.Request(url, data=urllib.parse.urlencode(fields).encode(), method="POST",
                                     headers={"Cookie": cookies,
                                              "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=WAIT) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
