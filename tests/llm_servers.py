"""Real local HTTP servers that speak the OpenAI chat-completions and Anthropic messages wire
formats, replying from a script. Tests point the official SDKs at them; nothing is patched."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def openai_reply_without_usage(text: str) -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def openai_reply(text: str, prompt_tokens: int = 120, completion_tokens: int = 60, cached: int = 20) -> dict:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "test-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}}


def openai_error(status: int, message: str, code: str = "error") -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "code": code, "param": None}}


def anthropic_reply(text: str, input_tokens: int = 80, output_tokens: int = 40, cache_read: int = 60) -> dict:
    return {"id": "msg_test", "type": "message", "role": "assistant", "model": "test-model",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                      "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": 0}}


def anthropic_error(status: int, kind: str, message: str) -> tuple[int, dict]:
    return status, {"type": "error", "error": {"type": kind, "message": message}}


class ScriptedLLMServer:
    """Each POST takes the next scripted step. A step is a reply dict (200); a (status, body) or
    (status, body, headers) tuple; ("sleep", seconds, step), which delays before answering (a stall
    when the client times out first); ("raw", status, bytes, content_type), a body that need not be
    JSON; or ("hangup",), which closes the connection without a reply. When the script runs out,
    `default` answers (a step, or a callable of the request number that returns one)."""

    def __init__(self, default: Any = None) -> None:
        self.script: list[Any] = []
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.times: list[float] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, "body": body})
                    server.headers.append(dict(self.headers))
                    server.times.append(time.monotonic())
                    n = len(server.requests)
                    step = server.script.pop(0) if server.script else server.default
                if callable(step):
                    step = step(n)
                if isinstance(step, tuple) and step and step[0] == "sleep":
                    time.sleep(step[1])
                    step = step[2]
                try:
                    if isinstance(step, tuple) and step and step[0] == "hangup":
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    if isinstance(step, tuple) and step and step[0] == "raw":
                        _, status, data, ctype = step
                        headers: dict[str, str] = {}
                    else:
                        status, payload, headers = (step + ({},))[:3] if isinstance(step, tuple) else (200, step, {})
                        data, ctype = json.dumps(payload).encode(), "application/json"
                    self.send_response(status)
                    self.send_header("content-type", ctype)
                    self.send_header("content-length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def received(self, n: int, timeout_s: float = 10.0) -> int:
        """How many requests the server has read, once it has read `n` or `timeout_s` passed: a client
        that gave up on a stalled request may have sent it before this server's thread got to read it."""
        deadline = time.monotonic() + timeout_s
        while len(self.requests) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(self.requests)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ScriptedLLMServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
