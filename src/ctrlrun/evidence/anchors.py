"""Anchors: a chain head ``(seq, hash)`` recorded where the store's writer cannot reach, so a
truncated or rewritten store is caught. Two providers ship: an append-only directory log and an
RFC 3161 timestamp authority (the ``[anchors]`` extra)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._time import format_precise, utc_now
from ..errors import CTRLRunError, InvalidArgument, MissingDependency
from ..action import canonical_bytes

__all__ = [
    "Anchor",
    "AnchorBreak",
    "AnchorProvider",
    "AnchorReport",
    "AnchorUnavailable",
    "DirectoryAnchors",
    "RFC3161Anchors",
    "anchor_checkpoint",
    "anchored_message",
    "make_anchors",
    "verify_anchors",
]

KINDS = ("interval", "checkpoint", "acts")
LOG_NAME = "anchors.jsonl"
MESSAGE_SCHEMA = "ctrlrun.anchor/v1"


class AnchorUnavailable(CTRLRunError):
    """The provider could not be asked: neither ok nor broken."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Anchor:
    """One anchor as the provider holds it; ``at`` is the provider's time."""

    seq: int
    hash: str
    token: str
    kind: str
    at: str


@runtime_checkable
class AnchorProvider(Protocol):
    """Where anchors are made and kept; every answer comes from the provider's own system."""

    def make(self, seq: int, hash: str, kind: str) -> tuple[str, str]: ...

    def check(self, seq: int, hash: str, token: str) -> bool: ...

    def latest(self) -> tuple[int, str] | None: ...

    def since(self, seq: int) -> Sequence[Anchor]: ...


def anchored_message(seq: int, hash: str) -> bytes:
    """The bytes an anchor vouches for: the pair, canonically."""
    return canonical_bytes({"schema": MESSAGE_SCHEMA, "seq": seq, "hash": hash})


def _check_pair(seq: Any, hash: Any, kind: Any = "interval") -> None:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidArgument(f"an anchor's seq must be an int >= 1, got {seq!r}")
    if not isinstance(hash, str) or not hash.startswith("sha256:"):
        raise InvalidArgument(f"an anchor's hash must be 'sha256:' and hex, got {hash!r}")
    if kind not in KINDS:
        raise InvalidArgument(f"anchor kind {kind!r} is not one of {', '.join(KINDS)}")


# -- the append-only log both shipped providers keep -----------------------------------------


class _Log:
    """``anchors.jsonl`` in a directory the operator made: appended and fsync'd, never created."""

    def __init__(self, directory: str | os.PathLike[str], what: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOG_NAME
        self.what = what

    def _need_directory(self) -> None:
        if not self.directory.is_dir():
            raise AnchorUnavailable(
                f"{self.what} directory {str(self.directory)!r} does not exist or is not a directory; "
                "ctrlrun never creates it: mount or create it (somewhere the store's writer cannot "
                "write), then anchor again"
            )

    def records(self) -> list[dict[str, Any]]:
        self._need_directory()
        try:
            text = self.path.read_text(encoding="utf-8") if self.path.exists() else ""
        except OSError as exc:
            raise AnchorUnavailable(f"cannot read {self.what} log {str(self.path)!r}: {exc}") from None
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
                int(record["seq"]), str(record["hash"]), str(record["token"])
            except (ValueError, TypeError, KeyError):
                raise AnchorUnavailable(
                    f"{self.what} log {str(self.path)!r} line {number} is not an anchor record; "
                    "the log was edited: restore it from its own copy"
                ) from None
            found.append(record)
        return found

    def append(self, record: dict[str, Any]) -> None:
        self._need_directory()
        line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if os.write(fd, line) != len(line):
                    raise OSError("short write")
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_directory(self.directory)
        except OSError as exc:
            raise AnchorUnavailable(f"cannot append to {self.what} log {str(self.path)!r}: {exc}") from None

    def anchors(self, seq: int) -> list[Anchor]:
        return [
            Anchor(seq=int(r["seq"]), hash=str(r["hash"]), token=str(r["token"]),
                   kind=str(r.get("kind", "interval")), at=str(r.get("at", "")))  # fmt: skip
            for r in self.records()
            if int(r["seq"]) >= seq
        ]

    def latest(self) -> tuple[int, str] | None:
        records = self.records()
        return None if not records else (int(records[-1]["seq"]), str(records[-1]["token"]))


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a platform without directory fds: the file itself was synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class DirectoryAnchors:
    """Anchors as lines of an append-only log in ``path``, a directory kept out of the store
    writer's reach (another host's mount, a separate account's synced bucket). Each token hashes
    its line together with the previous token, so a line edited or removed in the middle no
    longer checks."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._log = _Log(path, "anchor directory")

    @property
    def path(self) -> Path:
        return self._log.directory

    @staticmethod
    def _token(seq: int, hash: str, kind: str, at: str, previous: str) -> str:
        body = {"seq": seq, "hash": hash, "kind": kind, "at": at, "previous": previous}
        return "sha256:" + hashlib.sha256(canonical_bytes(body)).hexdigest()

    def make(self, seq: int, hash: str, kind: str) -> tuple[str, str]:
        _check_pair(seq, hash, kind)
        records = self._log.records()
        previous = str(records[-1]["token"]) if records else ""
        at = format_precise(utc_now())
        token = self._token(seq, hash, kind, at, previous)
        self._log.append({"seq": seq, "hash": hash, "kind": kind, "at": at, "token": token})
        return token, at

    def check(self, seq: int, hash: str, token: str) -> bool:
        previous = ""
        for r in self._log.records():
            expected = self._token(int(r["seq"]), str(r["hash"]), str(r.get("kind", "")), str(r.get("at", "")), previous)
            if r["token"] == token:
                return expected == token and int(r["seq"]) == seq and r["hash"] == hash
            previous = str(r["token"])
        return False

    def latest(self) -> tuple[int, str] | None:
        return self._log.latest()

    def since(self, seq: int) -> Sequence[Anchor]:
        return self._log.anchors(seq)


class RFC3161Anchors:
    """Anchors signed by an RFC 3161 timestamp authority at ``url``, checked offline against the
    authority's certificate (``certificate``: a PEM file; the TSA's certificate first, then any
    intermediates, the root last). A TSA keeps no history, so each token is also appended to the
    log in ``log``, a directory with DirectoryAnchors' rules."""

    def __init__(self, url: str, certificate: str | os.PathLike[str], *, log: str | os.PathLike[str],
                 timeout: float = 10.0) -> None:  # fmt: skip
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidArgument(f"RFC3161Anchors url must be an http(s) URL, got {url!r}")
        self.url = url
        self.certificate = Path(certificate)
        self.timeout = timeout
        self._log = _Log(log, "timestamp log")

    def _verifier(self) -> Any:
        rfc3161 = _rfc3161()
        from cryptography import x509

        try:
            certs = x509.load_pem_x509_certificates(self.certificate.read_bytes())
        except (OSError, ValueError) as exc:
            raise AnchorUnavailable(f"cannot read the TSA certificate {str(self.certificate)!r}: {exc}") from None
        builder = rfc3161.VerifierBuilder().add_root_certificate(certs[-1])
        if len(certs) > 1:
            builder = builder.tsa_certificate(certs[0])
            for middle in certs[1:-1]:
                builder = builder.add_intermediate_certificate(middle)
        return builder.build()

    def _ask(self, message: bytes) -> bytes:
        import urllib.request

        request = _rfc3161().TimestampRequestBuilder(data=message).build()
        post = urllib.request.Request(
            self.url, data=request.as_bytes(), method="POST",
            headers={"Content-Type": "application/timestamp-query", "Accept": "application/timestamp-reply"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(post, timeout=self.timeout) as reply:  # noqa: S310 - the operator's URL
                body: bytes = reply.read()
        except Exception as exc:  # any failure to reach the authority: unavailable
            raise AnchorUnavailable(f"timestamp authority {self.url} could not be reached: {exc}") from None
        return body

    def make(self, seq: int, hash: str, kind: str) -> tuple[str, str]:
        _check_pair(seq, hash, kind)
        self._log.records()  # refuse before asking when the log cannot be kept
        verifier = self._verifier()
        message = anchored_message(seq, hash)
        body = self._ask(message)
        rfc3161 = _rfc3161()
        try:
            response = rfc3161.decode_timestamp_response(body)
            verifier.verify_message(response, message)
        except Exception as exc:  # a reply that is not a valid token over the pair
            raise AnchorUnavailable(f"timestamp authority {self.url} answered with no valid token: {exc}") from None
        at = response.tst_info.gen_time.isoformat()
        token = base64.b64encode(body).decode("ascii")
        self._log.append({"seq": seq, "hash": hash, "kind": kind, "at": at, "token": token})
        return token, at

    def check(self, seq: int, hash: str, token: str) -> bool:
        verifier = self._verifier()
        rfc3161 = _rfc3161()
        try:
            response = rfc3161.decode_timestamp_response(base64.b64decode(token, validate=True))
            return bool(verifier.verify_message(response, anchored_message(seq, hash)))
        except Exception:  # not a token, or not one the authority signed over this pair
            return False

    def latest(self) -> tuple[int, str] | None:
        return self._log.latest()

    def since(self, seq: int) -> Sequence[Anchor]:
        return self._log.anchors(seq)


def _rfc3161() -> Any:
    try:
        import rfc3161_client
    except ImportError:
        raise MissingDependency(module="rfc3161_client", extra="anchors") from None
    return rfc3161_client


# -- making and verifying, against a store ---------------------------------------------------


def _provider_call(what: str, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except AnchorUnavailable:
        raise
    except Exception as exc:  # the operator's provider: any failure means it could not be asked
        raise AnchorUnavailable(f"the provider's {what}() failed: {type(exc).__name__}: {exc}") from None


def anchor_checkpoint(provider: Any, seq: int, hash: str) -> Anchor:
    """Exactly one anchor of kind ``checkpoint`` for a prune's ``(seq, hash)``."""
    token, at = _provider_call("make", provider.make, seq, hash, "checkpoint")
    return Anchor(seq=seq, hash=hash, token=str(token), kind="checkpoint", at=str(at))


def make_anchors(store: Any, provider: Any, kind: str = "interval") -> list[Anchor]:
    """Anchor the store's heads: ``interval`` the receipt head and the acts head (as ``acts``),
    ``checkpoint`` the current prune checkpoint. Each made anchor is noted in the store too."""
    targets: list[tuple[str, tuple[int, str]]] = []
    if kind == "interval":
        head = store.chain_head()
        if head is None or head[0] < 1:
            raise InvalidArgument("the store has no receipts yet: there is no head to anchor")
        targets.append(("interval", (int(head[0]), str(head[1]))))
        acts = store.acts_head()
        if acts is not None and acts[0] >= 1:
            targets.append(("acts", (int(acts[0]), str(acts[1]))))
    elif kind == "checkpoint":
        checkpoint = store.prune_checkpoint()
        if checkpoint is None:
            raise InvalidArgument("the store was never pruned: there is no checkpoint to anchor")
        targets.append(("checkpoint", (checkpoint.seq, checkpoint.hash)))
    else:
        raise InvalidArgument(f"--kind {kind!r} is not interval or checkpoint")
    made = []
    for name, (seq, hash) in targets:
        token, at = _provider_call("make", provider.make, seq, hash, name)
        anchor = Anchor(seq=seq, hash=hash, token=str(token), kind=name, at=str(at))
        store.note_anchor(name, seq, hash, anchor.token, anchor.at)
        made.append(anchor)
    return made


@dataclass(frozen=True, slots=True)
class AnchorBreak:
    """One anchor the store no longer matches."""

    name: str  # anchor_broken, anchor_missing or anchor_repudiated
    seq: int
    kind: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seq": self.seq, "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class AnchorReport:
    """What ``verify_anchors`` found: ``status`` is ``ok``, ``broken`` or ``unavailable``."""

    status: str
    checked: int
    breaks: tuple[AnchorBreak, ...] = ()
    error: str | None = None
    pruned: int = 0  # anchors below the checkpoint, accounted for by it

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.status, "checked": self.checked,
                "breaks": [b.to_dict() for b in self.breaks], "error": self.error}  # fmt: skip


def verify_anchors(store: Any, provider: Any) -> AnchorReport:
    """Every anchor the provider holds (never a local row), judged against the chain of its kind."""
    try:
        anchors = list(_provider_call("since", provider.since, 0))
        receipts_head = store.chain_head()
        acts_head = store.acts_head()
        checkpoint = store.prune_checkpoint()
        breaks: list[AnchorBreak] = []
        pruned = 0
        for a in anchors:
            seq, hash, kind, token = int(a.seq), str(a.hash), str(a.kind), str(a.token)
            found = _judge(store, seq, hash, kind, receipts_head, acts_head, checkpoint)
            if found == "pruned":
                pruned += 1
                continue
            if found is not None:
                breaks.append(AnchorBreak(found[0], seq, kind, found[1]))
                continue
            if not _provider_call("check", provider.check, seq, hash, token):
                breaks.append(AnchorBreak("anchor_repudiated", seq, kind,
                                          f"the provider does not vouch for its token for seq {seq} ({hash})"))  # fmt: skip
    except AnchorUnavailable as lost:
        return AnchorReport("unavailable", 0, (), str(lost))
    return AnchorReport("broken" if breaks else "ok", len(anchors), tuple(breaks), None, pruned)


def _judge(store: Any, seq: int, hash: str, kind: str, receipts_head: Any, acts_head: Any,
           checkpoint: Any) -> tuple[str, str] | str | None:  # fmt: skip
    if kind == "acts":
        chain, head, stored = "acts chain", acts_head, None
        if head is not None and seq <= head[0]:
            stored = store.act_hash_at(seq)
    else:
        chain, head, stored = "receipt chain", receipts_head, None
        if checkpoint is not None and seq < checkpoint.seq:
            return "pruned"
        if head is not None and seq <= head[0]:
            stored = checkpoint.hash if checkpoint is not None and seq == checkpoint.seq else store.receipt_hash_at(seq)
    if head is None or seq > head[0]:
        top = "empty" if head is None else f"at seq {head[0]}"
        return ("anchor_missing", f"anchored seq {seq} is above the {chain}'s head ({top}): the store was truncated")
    if stored is None:
        return ("anchor_missing", f"the {chain} has no seq {seq}, which was anchored: the store was truncated")
    if stored != hash:
        return ("anchor_broken", f"the {chain} at seq {seq} is {stored}, but {hash} was anchored: it was rewritten")
    return None
