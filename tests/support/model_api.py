"""A scripted model API on 127.0.0.1, for the agents' real clients to talk to.

`ScriptedModel` serves, from a thread of the test, the two model APIs the
clients call: Anthropic's Messages API (`POST /v1/messages`, streaming SSE or
one JSON body, and `POST /v1/messages/count_tokens`) for Claude Code, and
OpenAI's Responses API (`POST /v1/responses`, SSE) for Codex. It answers from
a script, the turns the model plans, and logs every request, so a test sees
what the model saw: the tools offered, the tool results, the hooks' context.

The script is consumed by the agent's own turns only: a request that offers
tools. A client also asks the model for side work (a session title, a topic),
without tools; those get `SIDE_ANSWER` and leave the script alone. When the
script is used up the model answers `DONE`, so a client run always ends.

    model = ScriptedModel([ToolUse("mcp__agentbus__publish", {"type": "note"}),
                           Text("published")])
    with model:
        ... run the client with ANTHROPIC_BASE_URL=model.url ...
    assert model.agent_requests()[1].tool_results() == [...]
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass
from dataclasses import field
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from typing import Any
from typing import Callable
from typing import Union

MODEL = "claude-sonnet-4-5"
SIDE_ANSWER = "ok"
DONE = "done"


@dataclass(frozen=True)
class Text:
    """A turn that answers with text and ends (`stop_reason: end_turn`)."""

    text: str


@dataclass(frozen=True)
class ToolUse:
    """A turn that calls one tool (`stop_reason: tool_use`); the client runs it and asks again."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)


Turn = Union[Text, ToolUse]
# A turn may also be decided on what the model is shown: a function of the request.
Planned = Union[Turn, Callable[["ModelRequest"], Turn]]


@dataclass
class ModelRequest:
    """One request a client made: its path, headers, JSON body and arrival (monotonic s)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @property
    def api(self) -> str:
        return "responses" if self.path.rstrip("/").endswith("/responses") else "messages"

    def tool_names(self) -> list[str]:
        """The tools offered to the model, by the names it calls them with."""
        return [name for tool in self.body.get("tools") or [] for name in names_of(tool)]

    def visible_tools(self, prefix: str) -> set[str]:
        """The tools named `prefix...` the model can call: offered whole, or named in the
        list of deferred tools Claude Code puts in the conversation (its tool search loads
        their schemas on demand)."""
        named = re.findall(re.escape(prefix) + r"[A-Za-z0-9_]+", json.dumps(
            [self.body.get("system"), self.body.get("messages"), self.body.get("input"),
             self.body.get("instructions")]))
        return {name for name in [*self.tool_names(), *named] if name.startswith(prefix)}

    def offers_tools(self) -> bool:
        return bool(self.body.get("tools"))

    def tool_results(self) -> list[str]:
        """The text of every tool result in the conversation so far, in order."""
        if self.api == "responses":
            return [_output_text(item.get("output")) for item in self.body.get("input") or []
                    if isinstance(item, dict) and item.get("type") == "function_call_output"]
        return [_content_text(block.get("content"))
                for message in self.body.get("messages") or []
                for block in _blocks(message.get("content"))
                if block.get("type") == "tool_result"]

    def text(self) -> str:
        """Everything the conversation holds as text (prompts, context, results), joined."""
        return json.dumps(self.body.get("messages") or self.body.get("input") or [])


def names_of(tool: dict[str, Any]) -> list[str]:
    """The names a tool of a request's `tools` is called by: Codex groups an MCP server's
    tools in a namespace (`mcp__agentbus` holding `publish`), named here as Claude Code
    names them (`mcp__agentbus__publish`)."""
    if tool.get("type") == "namespace":
        return [f"{tool['name']}__{name}" for inner in tool.get("tools") or []
                for name in names_of(inner)]
    return [tool.get("name") or tool.get("type", "")]


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [content] if isinstance(content, dict) else [
        block for block in content or [] if isinstance(block, dict)]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in _blocks(content))


def _output_text(output: Any) -> str:
    if isinstance(output, dict):  # {"content": ..., "success": ...} in some versions
        return _content_text(output.get("content"))
    return _content_text(output)


class ScriptedModel:
    """The model APIs on 127.0.0.1:<free port>, answering from `script` (see the module doc)."""

    def __init__(self, script: list[Planned] | None = None) -> None:
        self.script = list(script or [])
        self.requests: list[ModelRequest] = []
        self.answers: list[Turn] = []  # what each request was answered, in the same order
        self._changed = threading.Condition()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="scripted-model")

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # shutdown() waits, without a limit, for serve_forever to notice; a teardown must
        # not hang a whole run on it, so it gets 10 s on a thread of its own.
        stopping = threading.Thread(target=self._server.shutdown, daemon=True)
        stopping.start()
        stopping.join(timeout=10)
        self._server.server_close()
        self._thread.join(timeout=10)

    def agent_requests(self, api: str | None = None) -> list[ModelRequest]:
        """The requests of the agent's turns (those offering tools), in order."""
        with self._changed:
            return [r for r in self.requests if r.offers_tools() and (api is None or r.api == api)]

    def wait_for(self, condition: Callable[[list[ModelRequest]], Any], timeout: float,
                 what: str) -> Any:
        """Block until `condition(requests)` is true, and return its value; else fail."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (found := condition(list(self.requests))):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{what}: not within {timeout} s; requests: "
                                         f"{[(r.path, r.tool_names()[:3]) for r in self.requests]}")
                self._changed.wait(left)
            return found

    def wait_for_text(self, text: str, since: int, timeout: float) -> ModelRequest:
        """The first request of the agent's turns after the `since` first requests whose
        conversation holds `text` (a prompt, a hook's context, a tool's result)."""
        return self.wait_for(lambda requests: next(
            (r for r in requests[since:] if r.offers_tools() and text in r.text()), None),
            timeout, f"a model request holding {text!r}")

    def record(self, request: ModelRequest) -> Turn:
        """Log `request` and choose its answer: the next planned turn if it is the agent's."""
        with self._changed:
            self.requests.append(request)
            self._changed.notify_all()
            planned = (Text(SIDE_ANSWER) if not request.offers_tools()
                       else self.script.pop(0) if self.script else Text(DONE))
        turn = planned(request) if callable(planned) else planned
        with self._changed:
            self.answers.append(turn)
        return turn

    def turn_ended(self) -> bool:
        """Whether every request was answered and the last answer ended the agent's turn."""
        with self._changed:
            return len(self.answers) == len(self.requests) and (
                not self.answers or isinstance(self.answers[-1], Text))

    def next_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids):04d}"


def _handler_for(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # the test's output stays clean
            pass

        def do_GET(self) -> None:  # a model listing, a health check: nothing to script
            self._send_json(200 if "/models" in self.path else 404, {"data": [], "models": []})

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw.strip() else {}
            path = self.path.split("?")[0]
            if path.endswith("/count_tokens"):
                self._send_json(200, {"input_tokens": max(1, len(raw) // 4)})
                return
            if not (path.endswith("/messages") or path.endswith("/responses")):
                self._send_json(404, {"error": {"type": "not_found", "message": path}})
                return
            request = ModelRequest(path, dict(self.headers), body, time.monotonic())
            turn = model.record(request)
            if request.api == "responses":
                self._send_events(responses_events(model, turn))
            elif body.get("stream"):
                self._send_events(messages_events(model, body, turn))
            else:
                self._send_json(200, messages_body(model, body, turn))

        def _send_json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_events(self, events: list[dict[str, Any]]) -> None:
            data = b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
                            for event in events)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


# --- Anthropic's Messages API ------------------------------------------------------------


def _usage(output_tokens: int = 1) -> dict[str, int]:
    return {"input_tokens": 10, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _stop_reason(turn: Turn) -> str:
    return "tool_use" if isinstance(turn, ToolUse) else "end_turn"


def _content_block(model: ScriptedModel, turn: Turn) -> dict[str, Any]:
    if isinstance(turn, ToolUse):
        return {"type": "tool_use", "id": model.next_id("toolu"), "name": turn.name,
                "input": turn.input}
    return {"type": "text", "text": turn.text}


def messages_body(model: ScriptedModel, request: dict[str, Any], turn: Turn) -> dict[str, Any]:
    """The whole answer of a non-streaming `POST /v1/messages`."""
    return {"id": model.next_id("msg"), "type": "message", "role": "assistant",
            "model": request.get("model", MODEL), "content": [_content_block(model, turn)],
            "stop_reason": _stop_reason(turn), "stop_sequence": None, "usage": _usage()}


def messages_events(model: ScriptedModel, request: dict[str, Any],
                    turn: Turn) -> list[dict[str, Any]]:
    """The SSE events of a streaming `POST /v1/messages`, as the API sends them."""
    block = _content_block(model, turn)
    if isinstance(turn, ToolUse):
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(turn.input)}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": turn.text}
    message = {**messages_body(model, request, turn), "content": [], "stop_reason": None}
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": start},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": _stop_reason(turn),
                                            "stop_sequence": None}, "usage": _usage()},
        {"type": "message_stop"},
    ]


# --- OpenAI's Responses API --------------------------------------------------------------


def responses_events(model: ScriptedModel, turn: Turn) -> list[dict[str, Any]]:
    """The SSE events of `POST /v1/responses`: created, the output item, completed."""
    response_id = model.next_id("resp")
    if isinstance(turn, ToolUse):
        namespace, _, name = turn.name.rpartition("__")  # mcp__agentbus__publish, see names_of
        item = {"type": "function_call", "id": model.next_id("fc"),
                "call_id": model.next_id("call"), "name": name if namespace else turn.name,
                "arguments": json.dumps(turn.input)}
        if namespace:
            item["namespace"] = namespace
    else:
        item = {"type": "message", "role": "assistant", "id": model.next_id("msg"),
                "content": [{"type": "output_text", "text": turn.text, "annotations": []}]}
    usage = {"input_tokens": 10, "input_tokens_details": None, "output_tokens": 1,
             "output_tokens_details": None, "total_tokens": 11}
    return [
        {"type": "response.created", "response": {"id": response_id}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": {"id": response_id, "usage": usage}},
    ]
