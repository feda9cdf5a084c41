"""The supervisor's HTTP API: explicit routes, read-only GETs, actions behind a bearer token.

GET /healthz   200 while the supervisor runs
GET /readyz    200 when the engine is ready (canary passed), else 503
GET /status    JSON snapshot of the state machine
GET /metrics   Prometheus text from warden's own registry
GET /identity  the canonical run identity and its fingerprint (503 when it could not be built)
POST /actions/restart  end the engine and launch it again after a full preflight (202; 409 when it cannot)
POST /actions/*  need `Authorization: Bearer <token>`; with no token configured they are disabled
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

log = logging.getLogger("warden.api")

Snapshot = Callable[[], dict[str, Any]]
Action = Callable[[], tuple[int, dict[str, Any]]]  # what POST /actions/<name> does: its status and JSON answer


class ApiServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        snapshot: Snapshot,
        metrics: Callable[[], bytes],
        identity: Callable[[], dict[str, Any] | None] = lambda: None,
        token: str | None = None,
        actions: Mapping[str, Action] | None = None,
    ) -> None:
        self._actions = dict(actions or {})
        self._snapshot = snapshot
        self._metrics = metrics
        self._identity = identity
        self._token = token
        handler = self._handler_class()
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="warden-api", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout_s)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "warden"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s %s", self.address_string(), format % args)

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, payload: Any) -> None:
                self._send(status, json.dumps(payload, indent=1).encode() + b"\n", "application/json")

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    self._json(HTTPStatus.OK, {"status": "ok"})
                elif path == "/readyz":
                    state = server._snapshot()["state"]
                    ready = state == "ready"
                    self._json(
                        HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, {"ready": ready, "state": state}
                    )
                elif path == "/status":
                    self._json(HTTPStatus.OK, server._snapshot())
                elif path == "/metrics":
                    self._send(HTTPStatus.OK, server._metrics(), CONTENT_TYPE_LATEST)
                elif path == "/identity":
                    identity = server._identity()
                    if identity is None:
                        self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "no run identity (see /status)"})
                    else:
                        self._json(HTTPStatus.OK, identity)
                else:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no route GET {path}"})

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0]
                if not path.startswith("/actions/"):
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no route POST {path}"})
                    return
                if server._token is None:
                    self._json(
                        HTTPStatus.FORBIDDEN, {"error": "actions are disabled: set api.token_file in the profile"}
                    )
                    return
                given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                if not hmac.compare_digest(given.encode(), server._token.encode()):
                    self._json(HTTPStatus.UNAUTHORIZED, {"error": "missing or wrong bearer token"})
                    return
                action = server._actions.get(path.removeprefix("/actions/"))
                if action is None:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no action {path}"})
                    return
                log.warning("action %s requested by %s", path, self.address_string())
                status, payload = action()
                self._json(status, payload)

        return Handler
