"""The console's routes: pages and forms over the operator's store, identity from the session only."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..operator.text import safe
from ..store import StateStore
from . import acts, queries
from .auth import LoginLimiter, check_login, load_users, proxy_identity
from .csrf import FIELD, csrf_token, csrf_valid
from .settings import ConsoleSettings

__all__ = ["SESSION_AGE", "build_app"]

SESSION_AGE = timedelta(hours=8)
_HERE = Path(__file__).parent
_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
]


class _SecurityHeaders:
    """Every response carries the CSP, frame, referrer and no-store headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, sending)


@dataclass(frozen=True, slots=True)
class Who:
    """The signed-in approver: ``console:<name>`` or ``proxy:<value>``, and the bare name."""

    answerer: str
    name: str


Handler = Callable[[Request], Awaitable[Response]]


class Console:
    """The application's state: the store, the settings, the templates and the login limiter."""

    def __init__(self, store: StateStore, settings: ConsoleSettings) -> None:
        self.store = store
        self.settings = settings
        self.limiter = LoginLimiter(settings.clock)
        self.templates = Environment(loader=FileSystemLoader(_HERE / "templates"),
                                     autoescape=select_autoescape(default=True, default_for_string=True))  # fmt: skip

    # identity

    def who(self, request: Request) -> Who | None:
        """The approver of this request's session; None without one (or with an expired one)."""
        settings = self.settings
        session = request.session
        if settings.auth_header is not None:
            peer = request.client.host if request.client is not None else None
            value = proxy_identity(peer, settings.trusted_proxies, request.headers.getlist(settings.auth_header))
            if value is None:
                return None
            if session.get("proxy") != value:
                session.clear()
                session["proxy"] = value
            return Who(f"proxy:{value}", value)
        name = session.get("user")
        since = session.get("since")
        if not isinstance(name, str) or not isinstance(since, (int, float)):
            return None
        if settings.clock().timestamp() - since > SESSION_AGE.total_seconds():
            session.clear()
            return None
        return Who(f"console:{name}", name)

    def page(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        who = context.pop("who", None)
        notice = request.session.pop("notice", None)
        body = self.templates.get_template(name).render(
            who=safe(who.answerer) if who is not None else None, csrf=csrf_token(request.session),
            notice=notice, **context)  # fmt: skip
        return HTMLResponse(body, status_code=status)

    def refused(self, request: Request, who: Who | None, exc: acts.Refused, back: str | None) -> HTMLResponse:
        return self.page(request, "refused.html", exc.status, who=who, code=exc.code, message=safe(str(exc)), back=back)

    def guarded(self, handler: Callable[[Request, Who], Awaitable[Response]], *, api: bool = False) -> Handler:
        """Run ``handler`` for a signed-in approver; else 403 (proxy, POST), 401 (API) or 303 to /login."""

        async def run(request: Request) -> Response:
            who = self.who(request)
            if who is None:
                if self.settings.auth_header is not None or request.method != "GET":
                    return PlainTextResponse("forbidden: no signed-in approver", status_code=403)
                if api:
                    return JSONResponse({"error": "log in first"}, status_code=401)
                return RedirectResponse("/login", status_code=303)
            if request.method == "POST":
                form = await request.form()
                if not csrf_valid(request.session, form.get(FIELD)):
                    return PlainTextResponse("forbidden: missing or wrong CSRF token; reload the page", status_code=403)
            return await handler(request, who)

        return run

    # pages

    async def login_page(self, request: Request) -> Response:
        if self.settings.auth_header is not None:
            return RedirectResponse("/", status_code=303)
        return self.page(request, "login.html")

    async def login(self, request: Request) -> Response:
        if self.settings.auth_header is not None or self.settings.users_path is None:
            return PlainTextResponse("forbidden: this console takes its users from a proxy", status_code=403)
        form = await request.form()
        if not csrf_valid(request.session, form.get(FIELD)):
            return PlainTextResponse("forbidden: missing or wrong CSRF token; reload the login page", status_code=403)
        name, password = str(form.get("username") or ""), str(form.get("password") or "")
        if self.limiter.locked(name):
            return self.page(request, "login.html", 429, error="too many failed logins for this name: "
                             "it is locked for 15 minutes")  # fmt: skip
        if not check_login(load_users(self.settings.users_path), name, password):
            self.limiter.failed(name)
            return self.page(request, "login.html", 401, error="wrong user name or password")
        self.limiter.succeeded(name)
        request.session.clear()  # a new session: nothing from before the login carries over
        request.session.update({"user": name, "since": self.settings.clock().timestamp()})
        csrf_token(request.session)
        return RedirectResponse("/", status_code=303)

    async def logout(self, request: Request, who: Who) -> Response:
        request.session.clear()
        return RedirectResponse("/login" if self.settings.auth_header is None else "/", status_code=303)

    async def queue(self, request: Request, who: Who) -> Response:
        return self.page(request, "queue.html", who=who, rows=queries.pending_rows(self.store))

    async def request_page(self, request: Request, who: Who) -> Response:
        request_id = request.path_params["request_id"]
        view = queries.request_view(self.store, request_id, self.settings.clock())
        if view is None:
            exc = acts.Refused(f"no approval request {request_id}", status=404, code="unknown")
            return self.refused(request, who, exc, "/")
        may_answer = view.record.request.action.principal.user != who.name
        return self.page(request, "request.html", who=who, view=view, may_answer=may_answer, viewer=who.answerer)

    async def answer(self, request: Request, who: Who) -> Response:
        request_id = request.path_params["request_id"]
        verb = request.path_params["verb"]
        if verb not in ("approve", "deny", "edit"):
            return PlainTextResponse("not found", status_code=404)
        form = await request.form()
        back = f"/requests/{request_id}"
        try:
            if verb == "approve":
                done = acts.approve(self.store, request_id, who.answerer, who.name)
            elif verb == "deny":
                done = acts.deny(self.store, request_id, who.answerer, who.name, str(form.get("reason") or ""))
            else:
                policy = str(self.settings.policy_path) if self.settings.policy_path is not None else None
                done = acts.edit(self.store, request_id, who.answerer, who.name,
                                 str(form.get("arguments") or ""), policy)  # fmt: skip
        except acts.Refused as exc:
            return self.refused(request, who, exc, back if exc.status != 404 else "/")
        request.session["notice"] = safe(done)
        return RedirectResponse(back, status_code=303)

    async def effects(self, request: Request, who: Who) -> Response:
        state = request.query_params.get("state", "ambiguous")
        if state != "ambiguous":
            return RedirectResponse("/effects?state=ambiguous", status_code=303)
        return self.page(request, "effects.html", who=who, effects=queries.ambiguous_effects(self.store))

    async def resolve(self, request: Request, who: Who) -> Response:
        form = await request.form()
        try:
            done = acts.resolve(self.store, str(form.get("effect_key") or ""), str(form.get("state") or ""), who.answerer)
        except acts.Refused as exc:
            return self.refused(request, who, exc, "/effects?state=ambiguous")
        request.session["notice"] = safe(done)
        return RedirectResponse("/effects?state=ambiguous", status_code=303)

    async def receipts(self, request: Request, who: Who) -> Response:
        rows, report = queries.receipts_view(self.store)
        breaks = [safe(f"{b.name} at seq {b.seq}: {b.detail}") for b in report.breaks]
        return self.page(request, "receipts.html", who=who, rows=rows, report=report, breaks=breaks)

    async def api_pending(self, request: Request, who: Who) -> Response:
        return JSONResponse(queries.api_pending(self.store))

    async def healthz(self, request: Request) -> Response:
        if self.settings.auth_header is not None and self.who(request) is None:
            return PlainTextResponse("forbidden", status_code=403)
        try:
            self.store.chain_head()
        except Exception:  # the store did not answer: the health check says so, nothing more
            return PlainTextResponse("store unavailable", status_code=503)
        return PlainTextResponse("ok")


def build_app(store: StateStore, settings: ConsoleSettings) -> Starlette:
    """The console as an ASGI application over an opened store (the caller closes it)."""
    console = Console(store, settings)
    guard = console.guarded
    routes = [
        Route("/login", console.login_page, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", guard(console.logout), methods=["POST"]),
        Route("/", guard(console.queue), methods=["GET"]),
        Route("/requests/{request_id}", guard(console.request_page), methods=["GET"]),
        Route("/requests/{request_id}/{verb:str}", guard(console.answer), methods=["POST"]),
        Route("/effects", guard(console.effects), methods=["GET"]),
        Route("/effects/resolve", guard(console.resolve), methods=["POST"]),
        Route("/receipts", guard(console.receipts), methods=["GET"]),
        Route("/api/pending", guard(console.api_pending, api=True), methods=["GET"]),
        Route("/healthz", console.healthz, methods=["GET"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(_SecurityHeaders),
        Middleware(SessionMiddleware, secret_key=settings.secret.decode("latin-1"), session_cookie="ctrlrun_console",
                   max_age=int(SESSION_AGE.total_seconds()), same_site="strict", https_only=settings.secure_cookie),  # fmt: skip
    ]
    return Starlette(routes=routes, middleware=middleware)
