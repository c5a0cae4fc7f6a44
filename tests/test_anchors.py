"""Anchors against both shipped providers: a truncated store is ``anchor_missing``, a receipt
rewritten below an anchor ``anchor_broken``, a provider that cannot be asked ``unavailable`` (exit
3, never ok and never a break); the real timestamp authority is ``openssl ts -reply`` behind a
loopback HTTP handler, with a CA made here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import delete, update

from ctrlrun.evidence.anchors import Anchor, AnchorProvider, AnchorUnavailable, DirectoryAnchors, RFC3161Anchors, make_anchors, verify_anchors
from ctrlrun.errors import InvalidArgument
from ctrlrun.store.memory import InMemoryStateStore

from ._cli_helpers import invoke
from .test_acts_chain import World

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None and not os.environ.get("CI"), reason="openssl is not installed")


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL or "openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def tsa(tmp_path_factory):
    """A timestamp authority on a loopback port: ``(url, certificate PEM path, stop)``."""
    d = tmp_path_factory.mktemp("tsa")
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-subj",
         "/CN=ctrlrun test CA", "-days", "2", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)  # fmt: skip
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tsa.key", "-out", "tsa.csr", "-subj",
         "/CN=ctrlrun test TSA", cwd=d)  # fmt: skip
    (d / "ext.cnf").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                               "extendedKeyUsage=critical,timeStamping\n")  # fmt: skip
    _run("x509", "-req", "-in", "tsa.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "tsa.crt", "-days", "2", "-extfile", "ext.cnf", cwd=d)  # fmt: skip
    (d / "serial").write_text("01\n")
    (d / "tsa.cnf").write_text(
        "[ tsa ]\ndefault_tsa = tsa_config\n[ tsa_config ]\n"
        f"serial = {d}/serial\ncrypto_device = builtin\nsigner_cert = {d}/tsa.crt\n"
        f"signer_key = {d}/tsa.key\nsigner_digest = sha256\ndefault_policy = 1.2.3.4.1\n"
        "digests = sha256, sha384, sha512\naccuracy = secs:1\nordering = yes\ntsa_name = yes\n"
        "ess_cert_id_chain = no\ness_cert_id_alg = sha256\n"
    )  # fmt: skip
    (d / "chain.pem").write_bytes((d / "tsa.crt").read_bytes() + (d / "ca.crt").read_bytes())
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            query = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                (d / "q.tsq").write_bytes(query)
                _run("ts", "-reply", "-config", "tsa.cnf", "-queryfile", "q.tsq", "-out", "r.tsr", cwd=d)
                reply = (d / "r.tsr").read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/timestamp-reply")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/tsa", d / "chain.pem"
    server.shutdown()
    server.server_close()


def _unreachable_url() -> str:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/tsa"


@pytest.fixture(params=["directory", "rfc3161"])
def provider(request, tmp_path):
    log = tmp_path / "anchor-log"
    log.mkdir()
    if request.param == "directory":
        return DirectoryAnchors(log)
    if OPENSSL is None and not os.environ.get("CI"):
        pytest.skip("openssl is not installed")
    url, certificate = request.getfixturevalue("tsa")
    return RFC3161Anchors(url, certificate, log=log)


def _filled(store, clock, n=6):
    world = World(store, clock)
    first = len(store.receipts())
    for i in range(first, first + n):
        world.call(f"txn_{i}", 100)
    return world


def _edit(store, seq, *, remove=False, **values):
    if isinstance(store, InMemoryStateStore):
        rows = [k for k, r in store._data.receipts.items() if r["seq"] >= seq] if remove else []
        for key in rows:
            del store._data.receipts[key]
        if remove:
            store._data.head = (seq - 1, store.receipt_hash_at(seq - 1) or "")
        for r in store._data.receipts.values():
            if r["seq"] == seq and values:
                r.update(values)
        return
    from ctrlrun.store.schema import receipt_chain, receipts

    with store.engine.connect() as conn:
        if remove:
            conn.execute(delete(receipts).where(receipts.c.seq >= seq))
            prev = conn.execute(receipts.select().where(receipts.c.seq == seq - 1)).mappings().one()
            conn.execute(update(receipt_chain).values(seq=seq - 1, hash=prev["hash"]))
        else:
            conn.execute(update(receipts).where(receipts.c.seq == seq).values(**values))
        conn.commit()


def test_the_shipped_providers_are_anchor_providers(tmp_path):
    assert isinstance(DirectoryAnchors(tmp_path), AnchorProvider)
    assert isinstance(RFC3161Anchors("http://127.0.0.1:1/", tmp_path / "c.pem", log=tmp_path), AnchorProvider)


def test_an_intact_store_matches_every_anchor(store, clock, provider):
    world = _filled(store, clock)
    store.grant_approval(world.ask("big"), "alice")
    made = make_anchors(store, provider)
    assert [a.kind for a in made] == ["interval", "acts"]
    assert made[0].seq == store.chain_head()[0] and made[1].seq == store.acts_head()[0]
    held = provider.since(0)
    assert [(a.seq, a.hash, a.kind) for a in held] == [(a.seq, a.hash, a.kind) for a in made]
    assert all(isinstance(a, Anchor) for a in held) and provider.latest() == (made[-1].seq, made[-1].token)
    _filled(store, clock, 2)  # appends above an anchor are the exposed window: never a break
    report = verify_anchors(store, provider)
    assert (report.status, report.checked, report.breaks) == ("ok", 2, ())


def test_a_truncated_store_is_anchor_missing(store, clock, provider):
    _filled(store, clock)
    make_anchors(store, provider)
    head = store.chain_head()[0]
    _edit(store, head - 1, remove=True)
    report = verify_anchors(store, provider)
    assert report.status == "broken" and not report.ok
    assert [(b.name, b.seq, b.kind) for b in report.breaks] == [("anchor_missing", head, "interval")]


def test_a_receipt_rewritten_below_an_anchor_is_anchor_broken(store, clock, provider):
    _filled(store, clock)
    make_anchors(store, provider)
    head = store.chain_head()[0]
    _edit(store, head, hash="sha256:" + "5" * 64)  # a rewrite that recomputed the hash
    report = verify_anchors(store, provider)
    assert [(b.name, b.seq) for b in report.breaks] == [("anchor_broken", head)]


def test_an_edited_act_is_anchor_broken(store, clock, tmp_path):
    provider = DirectoryAnchors(tmp_path)
    world = _filled(store, clock, 2)
    store.grant_approval(world.ask("big"), "alice")
    make_anchors(store, provider)
    if isinstance(store, InMemoryStateStore):
        store._data.evidence.acts[0] = store._data.evidence.acts[0][:-1] + ("sha256:" + "6" * 64,)
    else:
        from ctrlrun.store.schema import acts

        with store.engine.connect() as conn:
            conn.execute(update(acts).where(acts.c.seq == 1).values(hash="sha256:" + "6" * 64))
            conn.commit()
    report = verify_anchors(store, provider)
    assert [(b.name, b.seq, b.kind) for b in report.breaks] == [("anchor_broken", 1, "acts")]


def test_a_token_the_provider_does_not_vouch_for_is_repudiated(store, clock, provider):
    _filled(store, clock)
    made = make_anchors(store, provider)
    log = provider._log.path
    lines = log.read_text().splitlines()
    record = json.loads(lines[0])
    record["token"] = made[0].token[:-8] + ("A" * 8 if made[0].token[-1] != "A" else "B" * 8)
    log.write_text(json.dumps(record) + "\n")
    report = verify_anchors(store, provider)
    assert [(b.name, b.seq) for b in report.breaks] == [("anchor_repudiated", made[0].seq)]


def test_anchors_below_the_checkpoint_are_accounted_for(store, clock, provider):
    _filled(store, clock, 8)
    make_anchors(store, provider)  # at seq 8
    _filled(store, clock, 4)
    store.prune(10, older_than=timedelta(0), by="ops", reason="retention",
                anchor=lambda seq, hash: provider.make(seq, hash, "checkpoint"))  # fmt: skip
    report = verify_anchors(store, provider)
    assert (report.status, report.checked, report.pruned) == ("ok", 2, 1)  # the interval anchor at 8 is pruned


@needs_openssl
def test_an_unreachable_authority_is_unavailable(store, clock, tmp_path, tsa):
    _filled(store, clock)
    log = tmp_path / "log"
    log.mkdir()
    reachable = RFC3161Anchors(tsa[0], tsa[1], log=log)
    make_anchors(store, reachable)
    with pytest.raises(AnchorUnavailable, match="could not be reached"):
        make_anchors(store, RFC3161Anchors(_unreachable_url(), tsa[1], log=log))
    assert len(reachable.since(0)) == 1  # the failed make recorded nothing
    gone = RFC3161Anchors(tsa[0], tmp_path / "no-such.pem", log=log)
    report = verify_anchors(store, gone)
    assert (report.status, report.ok, report.breaks) == ("unavailable", False, ())


def test_a_missing_directory_is_unavailable_never_an_empty_history(store, clock, tmp_path):
    _filled(store, clock)
    missing = DirectoryAnchors(tmp_path / "not-mounted")
    with pytest.raises(AnchorUnavailable, match="never creates it"):
        make_anchors(store, missing)
    assert not (tmp_path / "not-mounted").exists()
    report = verify_anchors(store, missing)
    assert (report.status, report.breaks) == ("unavailable", ())


def test_a_provider_that_raises_is_unavailable(store, clock):
    _filled(store, clock)

    class Broken:
        def since(self, seq):
            raise ConnectionError("bucket offline")

    report = verify_anchors(store, Broken())
    assert report.to_dict() == {"ok": False, "status": "unavailable", "checked": 0, "breaks": [],
                                "error": "the provider's since() failed: ConnectionError: bucket offline"}  # fmt: skip


# -- the command ------------------------------------------------------------------------------


def _provider_module(tmp_path, monkeypatch, source):
    name = "anchors_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)  # one per test
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:PROVIDER"


@pytest.mark.parametrize("kind", ["directory", "rfc3161"])
def test_the_anchor_command(project, tmp_path, monkeypatch, kind, request):
    log = tmp_path / "offsite"
    log.mkdir()
    if kind == "directory":
        source = f"from ctrlrun.evidence.anchors import DirectoryAnchors\nPROVIDER = DirectoryAnchors({str(log)!r})\n"
    else:
        if OPENSSL is None and not os.environ.get("CI"):
            pytest.skip("openssl is not installed")
        url, cert = request.getfixturevalue("tsa")
        source = (f"from ctrlrun.evidence.anchors import RFC3161Anchors\n"
                  f"PROVIDER = RFC3161Anchors({url!r}, {str(cert)!r}, log={str(log)!r})\n")  # fmt: skip
    spec = _provider_module(tmp_path, monkeypatch, source)
    for i in range(4):
        project.call(payment_id=f"txn_{i}", amount=100)
    url = ["--store-url", f"sqlite:///{project.db}"]
    made = invoke(["anchor", "--provider", spec, *url], clock=project.clock)
    assert made.code == 0, made.err
    assert made.out.startswith("anchored seq 4 sha256:") and "(interval)" in made.out
    ok = invoke(["anchor", "--provider", spec, "--verify", "--json", *url])
    assert ok.code == 0 and json.loads(ok.out) == {"ok": True, "status": "ok", "checked": 1, "breaks": [], "error": None}
    text = invoke(["anchor", "--provider", spec, "--verify", *url])
    assert text.code == 0 and text.out == "anchors: 1 checked, the store matches every one\n"
    import sqlite3

    with sqlite3.connect(project.db) as db:
        db.execute("UPDATE receipts SET hash = ? WHERE seq = 4", ("sha256:" + "7" * 64,))
    broken = invoke(["anchor", "--provider", spec, "--verify", "--json", *url])
    document = json.loads(broken.out)
    assert broken.code == 1 and len(broken.out.splitlines()) == 1
    assert (document["ok"], document["status"], [b["name"] for b in document["breaks"]]) == (False, "broken", ["anchor_broken"])
    assert set(document["breaks"][0]) == {"name", "seq", "kind", "detail"}
    shown = invoke(["anchor", "--provider", spec, "--verify", *url])
    assert shown.code == 1 and "anchor_broken at seq 4 (interval)" in shown.out


def test_the_anchor_command_when_the_provider_cannot_be_asked(project, tmp_path, monkeypatch):
    spec = _provider_module(tmp_path, monkeypatch,
                            f"from ctrlrun.evidence.anchors import DirectoryAnchors\nPROVIDER = DirectoryAnchors({str(tmp_path / 'gone')!r})\n")  # fmt: skip
    for i in range(3):
        project.call(payment_id=f"txn_{i}", amount=100)
    url = ["--store-url", f"sqlite:///{project.db}"]
    made = invoke(["anchor", "--provider", spec, "--json", *url], clock=project.clock)
    assert made.code == 3 and json.loads(made.out)["status"] == "unavailable"
    checked = invoke(["anchor", "--provider", spec, "--verify", "--json", *url])
    document = json.loads(checked.out)
    assert checked.code == 3 and (document["ok"], document["status"], document["breaks"]) == (False, "unavailable", [])
    text = invoke(["anchor", "--provider", spec, "--verify", *url])
    assert text.code == 3 and "unavailable" in text.err and "Traceback" not in text.err + text.out
    pruned = invoke(["prune", "--through", "1", "--older-than", "1d", "--by", "o", "--reason", "r",
                     "--provider", spec, *url])  # fmt: skip
    assert pruned.code == 3 and "nothing was deleted" in pruned.err
    assert project.store.prune_checkpoint() is None and len(project.store.receipts()) == 3
    bad = invoke(["anchor", "--provider", spec.replace(":PROVIDER", ":NOPE"), *url])
    assert bad.code == 1 and "has no attribute 'NOPE'" in bad.err


# -- Control(anchor=..., anchor_every=N) -------------------------------------------------------


class Recording:
    """A provider in memory that can be made to fail."""

    def __init__(self, fail=0):
        self.anchors, self.fail = [], fail

    def make(self, seq, hash, kind):
        if self.fail:
            self.fail -= 1
            raise ConnectionError("provider down")
        self.anchors.append(Anchor(seq=seq, hash=hash, token=f"t{len(self.anchors)}", kind=kind, at="now"))
        return self.anchors[-1].token, "now"

    def check(self, seq, hash, token):
        return True

    def latest(self):
        return None if not self.anchors else (self.anchors[-1].seq, self.anchors[-1].token)

    def since(self, seq):
        return [a for a in self.anchors if a.seq >= seq]


def _control(store, clock, provider, every):
    import ctrlrun
    from ctrlrun import Control, Policy

    policy = Policy.from_yaml("schema: ctrlrun.policy/v2\nactions:\n  pay.refund:\n    effect: 'refund:{payment_id}'\n"
                              "    decision: allow\n")  # fmt: skip
    control = Control(policy, store, clock=clock, anchor=provider, anchor_every=every)
    refund = ctrlrun.protect("pay.refund", control=control)(lambda payment_id: {"id": payment_id})
    return control, refund


def test_control_anchors_after_every_n_receipts_off_the_call_path(store, clock):
    import ctrlrun

    provider = Recording()
    control, refund = _control(store, clock, provider, 3)
    anchoring = control.sinks[-1]
    with ctrlrun.context(agent="a"):
        for i in range(7):
            refund(payment_id=f"p{i}")
            if i == 2:
                assert anchoring.wait(1, timeout=30)
    assert anchoring.wait(2, timeout=30)
    anchoring.close()
    assert [a.kind for a in provider.anchors] == ["interval", "interval"]
    assert provider.anchors[0].seq >= 3 and provider.anchors[1].seq >= 6
    assert verify_anchors(store, provider).ok


def test_a_failed_anchor_never_fails_a_call_and_is_tried_again(store, clock, caplog):
    import ctrlrun

    provider = Recording(fail=1)
    control, refund = _control(store, clock, provider, 2)
    anchoring = control.sinks[-1]
    with ctrlrun.context(agent="a"):
        refund(payment_id="p0")
        refund(payment_id="p1")  # the anchor run fails: the call does not
        assert anchoring.wait(1, timeout=30) and anchoring.failed == 1
        refund(payment_id="p2")  # tried again after the next receipt
        assert anchoring.wait(2, timeout=30)
    anchoring.close()
    assert anchoring.made == 1 and len(provider.anchors) == 1
    assert "anchoring the store's heads failed" in caplog.text


def test_control_anchor_arguments_are_checked(store, clock):
    from ctrlrun.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="go together"):
        _control(store, clock, Recording(), None)
    with pytest.raises(InvalidArgument, match="anchor_every"):
        _control(store, clock, Recording(), 0)
    with pytest.raises(InvalidArgument, match="has no make"):
        _control(store, clock, object(), 5)


def test_a_checkpoint_anchor_is_judged_against_the_checkpoint_row(store, clock, tmp_path):
    provider = DirectoryAnchors(tmp_path)
    _filled(store, clock, 8)
    with pytest.raises(InvalidArgument, match="never pruned"):
        make_anchors(store, provider, "checkpoint")
    store.prune(5, older_than=timedelta(0), by="ops", reason="retention")
    (made,) = make_anchors(store, provider, "checkpoint")
    assert (made.kind, made.seq, made.hash) == ("checkpoint", 5, store.prune_checkpoint().hash)
    assert verify_anchors(store, provider).ok
    if isinstance(store, InMemoryStateStore):
        from dataclasses import replace

        store._data.evidence.checkpoint = replace(store._data.evidence.checkpoint, hash="sha256:" + "8" * 64)
    else:
        from ctrlrun.store.schema import prune_checkpoint

        with store.engine.connect() as conn:
            conn.execute(update(prune_checkpoint).values(hash="sha256:" + "8" * 64))
            conn.commit()
    assert [(b.name, b.seq, b.kind) for b in verify_anchors(store, provider).breaks] == [("anchor_broken", 5, "checkpoint")]
