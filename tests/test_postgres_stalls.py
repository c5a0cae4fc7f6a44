"""Real OS processes against the real Postgres: one stopped mid-call or mid-transaction, or
its connection blackholed by a local proxy (``tests/_faultproxy.py``), never stops another;
connecting through a silent network is a ``CTRLRunError`` within the connect timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ctrlrun
from ctrlrun.errors import CTRLRunError
from ctrlrun.postgres import PostgresStateStore, PostgresTimeouts
from ctrlrun.receipt import verify_chain

needs_server = pytest.mark.postgres


def _quick(pg_url, pg_schema, **timeouts) -> PostgresStateStore:
    return PostgresStateStore(pg_url, schema=pg_schema, timeouts=PostgresTimeouts(**timeouts))


# --------------------------------------------------------------------------- real processes

REPO = Path(__file__).resolve().parents[1]
BOUND = 120  # seconds: a generous test-level bound, so a hang fails the test instead


class Worker:
    """A ``tests._faultworkers`` child process; its stdout lines arrive on a queue."""

    def __init__(self, mode: str, **args) -> None:
        import os
        import queue
        import subprocess
        import sys
        import threading

        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests._faultworkers", mode, json.dumps(args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EXIT")

    def line(self) -> str:
        import queue

        try:
            return self.lines.get(timeout=BOUND)
        except queue.Empty:
            self.kill()
            pytest.fail(f"worker {self.proc.pid} said nothing for {BOUND} s")

    def stopped(self) -> None:
        """Wait until the worker has stopped itself (SIGSTOP)."""
        import os
        import threading

        seen: list[int] = []
        waiter = threading.Thread(
            target=lambda: seen.append(os.waitpid(self.proc.pid, os.WUNTRACED)[1]), daemon=True
        )
        waiter.start()
        waiter.join(BOUND)
        if not seen or not os.WIFSTOPPED(seen[0]):
            self.kill()
            pytest.fail(f"worker {self.proc.pid} did not stop where the test stops it")

    def cont(self) -> None:
        import os
        import signal

        os.kill(self.proc.pid, signal.SIGCONT)

    def say(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        import os
        import signal

        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(BOUND)


def _through(pg_url: str, port: int) -> str:
    """``pg_url`` pointed at ``127.0.0.1:port`` (the proxy)."""
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(pg_url)
    user = params.get("user")
    return f"postgresql://{user + '@' if user else ''}127.0.0.1:{port}/{params.get('dbname', '')}"


def _server(pg_url: str) -> tuple[str, int]:
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(pg_url)
    return str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432)


QUICK = {"lock": 2.0, "connect": 2.0}


@needs_server
def test_a_writer_stopped_in_its_call_does_not_stop_another(pg_url, pg_schema):
    """One process stopped inside its function (its start committed); another process's
    allowed call on another key completes; the first finishes once continued."""
    frozen = Worker("stop_in_call", url=pg_url, schema=pg_schema, payment_id="a", timeouts=QUICK)
    try:
        assert frozen.line() == "OPENED"
        frozen.stopped()
        other = Worker("call", url=pg_url, schema=pg_schema, payment_id="b", timeouts=QUICK)
        assert [other.line(), other.line()] == ["OPENED", "DONE ok"]
        frozen.cont()
        assert frozen.line() == "DONE ok"
    finally:
        frozen.kill()
    store = PostgresStateStore(pg_url, schema=pg_schema)
    assert {e.effect_key: e.state.value for e in store.list_effects()} == {
        "refund:a": "committed", "refund:b": "committed",
    }  # fmt: skip
    assert verify_chain(store).ok
    store.close()


@needs_server
def test_a_writer_stopped_inside_its_transaction_holds_only_its_own_rows(pg_url, pg_schema):
    """Stopped before its COMMIT, holding its key's and its approval's rows: another key's
    call completes; a writer on the same key hears a clear lock timeout (nothing written); once
    the stopped process is gone, that writer succeeds."""
    from ctrlrun._time import utc_now

    from .test_store_conformance import granted_request, make_action

    store = _quick(pg_url, pg_schema, lock=0.3)
    action = make_action()
    request = granted_request(store, utc_now, action)
    frozen = Worker(
        "stop_before_commit", url=pg_url, schema=pg_schema, timeouts={"lock": 2.0},
        approval_id=request.request_id, action_hash=action.action_hash, effect_key="held",
    )  # fmt: skip
    try:
        assert frozen.line() == "OPENED"
        frozen.stopped()
        other = Worker("call", url=pg_url, schema=pg_schema, payment_id="b", timeouts=QUICK)
        assert [other.line(), other.line()] == ["OPENED", "DONE ok"]
        with pytest.raises(CTRLRunError, match="lock_timeout") as info:
            store.reserve_effect("held", "mine")
        assert not isinstance(info.value, ctrlrun.AmbiguousWrite)
        assert "nothing was written: retry" in str(info.value)
    finally:
        frozen.kill()
    patient = _quick(pg_url, pg_schema, lock=float(BOUND))  # waits out the dead session
    assert patient.reserve_effect("held", "mine").effect_key == "held"
    assert store.get_effect("held").action_id == "mine"
    patient.close()
    store.close()


@needs_server
def test_a_blackholed_writer_does_not_stop_another(pg_url, pg_schema):
    """One process's connection goes silent mid-call (the proxy holds its bytes); another
    process's call completes; the first finishes once the network is back."""
    from ._faultproxy import fault_proxy

    with fault_proxy(_server(pg_url)) as proxy:
        silent = Worker("wait_in_call", url=_through(pg_url, proxy.port), schema=pg_schema,
                        payment_id="a", timeouts=QUICK)  # fmt: skip
        try:
            assert [silent.line(), silent.line()] == ["OPENED", "RUNNING"]
            proxy.blackhole()
            silent.say("finish")  # its finish now waits in the proxy
            other = Worker("call", url=pg_url, schema=pg_schema, payment_id="b", timeouts=QUICK)
            assert [other.line(), other.line()] == ["OPENED", "DONE ok"]
            proxy.resume()
            assert silent.line() == "DONE ok"
        finally:
            silent.kill()
    store = PostgresStateStore(pg_url, schema=pg_schema)
    assert {e.effect_key: e.state.value for e in store.list_effects()} == {
        "refund:a": "committed", "refund:b": "committed",
    }  # fmt: skip
    store.close()


@needs_server
def test_connecting_through_a_blackholed_proxy_is_a_ctrlrun_error(pg_url, pg_schema):
    from ._faultproxy import fault_proxy

    with fault_proxy(_server(pg_url)) as proxy:
        proxy.blackhole()
        worker = Worker("open", url=_through(pg_url, proxy.port), schema=pg_schema,
                        timeouts={"connect": 2})  # fmt: skip
        try:
            line = worker.line()
        finally:
            worker.kill()
    assert line.startswith("ERROR StoreUnavailable: cannot reach the Postgres store"), line
    assert "while connecting" in line
