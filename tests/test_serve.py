"""``ssindex serve``: a real MCP server over stdio, driven by the real MCP client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ssindex import build

CLI = str(Path(sys.executable).with_name("ssindex"))
FILES = {
    "config_loader.py": 'import json\n\n\ndef load_settings(path):\n'
                        '    """Parse a JSON configuration file into a dict."""\n'
                        '    with open(path) as handle:\n        return json.load(handle)\n',
    "echo_server.py": 'import socket\n\n\nclass EchoServer:\n'
                      '    def serve_forever(self, port):\n        sock = socket.socket()\n'
                      '        sock.bind(("", port))\n        sock.listen()\n',
    "numbers.py": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
                  "        a, b = b, a + b\n    return a\n",
}
FIELDS = {"path", "start_line", "end_line", "symbol", "kind", "score", "text"}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve-repo")
    for name, text in FILES.items():
        (root / name).write_text(text, encoding="utf-8")
    return Path(build(root)["index"])


def _params(index: Path) -> StdioServerParameters:
    return StdioServerParameters(command=CLI, args=["serve", "--index", str(index)],
                                 env=dict(os.environ))


def _dump(model: Any) -> dict[str, Any]:
    return dict(model.model_dump(by_alias=True, exclude_none=True))


async def _session_calls(index: Path, log: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with log.open("w") as errlog:
        async with stdio_client(_params(index), errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            out["tools"] = [_dump(tool) for tool in (await session.list_tools()).tools]
            calls: dict[str, tuple[str, dict[str, Any]]] = {
                "search": ("search", {"query": "parse a JSON configuration file", "k": 3}),
                "lexical": ("search", {"query": "EchoServer serve_forever", "mode": "lexical"}),
                "status": ("status", {}),
                "bad_mode": ("search", {"query": "x", "mode": "nonsense"}),
                "filtered": ("search", {"query": "parse a JSON configuration file",
                                        "path": ["echo_*.py"], "kind": ["class"],
                                        "context": 1}),
                "bad_language": ("search", {"query": "x", "lang": ["cobol"]}),
            }
            for name, (tool, args) in calls.items():
                out[name] = _dump(await session.call_tool(tool, args))
    return out


def _payload(result: dict[str, Any]) -> dict[str, Any]:
    assert not result.get("isError"), result
    return dict(json.loads(result["content"][0]["text"]))


def test_serve_through_mcp_client(index: Path, tmp_path: Path) -> None:
    calls = anyio.run(_session_calls, index, tmp_path / "server.log")

    tools = {tool["name"]: tool for tool in calls["tools"]}
    assert set(tools) == {"search", "status"}
    assert {"query", "k", "mode"} <= set(tools["search"]["inputSchema"]["properties"])
    assert tools["search"]["inputSchema"]["required"] == ["query"]

    hits = _payload(calls["search"])["results"]
    assert 1 <= len(hits) <= 3
    assert all(set(hit) >= FIELDS for hit in hits)
    assert hits[0]["path"] == "config_loader.py"
    assert "load_settings" in hits[0]["text"]
    assert [hit["score"] for hit in hits] == sorted((hit["score"] for hit in hits), reverse=True)
    assert _payload(calls["lexical"])["results"][0]["path"] == "echo_server.py"

    cli_status = json.loads(subprocess.run(
        [CLI, "status", "--index", str(index), "--json"], capture_output=True, text=True,
        check=True, timeout=300).stdout)
    assert _payload(calls["status"]) == cli_status

    assert calls["bad_mode"].get("isError")
    assert "unknown mode" in calls["bad_mode"]["content"][0]["text"]

    assert {"path", "exclude", "lang", "kind", "symbol", "tests", "context"} <= set(
        tools["search"]["inputSchema"]["properties"])
    filtered = _payload(calls["filtered"])
    assert filtered["filters"]["paths"] == ["echo_*.py"]
    assert [(hit["path"], hit["symbol"]) for hit in filtered["results"]] == [
        ("echo_server.py", "EchoServer")]
    assert filtered["results"][0]["context"] == {"before": [], "after": []}  # the whole file
    assert calls["bad_language"].get("isError")
    assert "unknown language 'cobol'" in calls["bad_language"]["content"][0]["text"]


def test_stdout_carries_only_the_protocol(index: Path) -> None:
    """Raw JSON-RPC over the pipe: every line the server writes is a protocol message."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "search", "arguments": {"query": "fibonacci numbers", "k": 1}}},
    ]
    proc = subprocess.Popen([CLI, "serve", "--index", str(index)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.flush()
        replies: list[dict[str, Any]] = []
        while not any(reply.get("id") == 2 for reply in replies):
            line = proc.stdout.readline()
            assert line, "server closed stdout before answering"
            replies.append(json.loads(line))  # a non-protocol line fails here
        proc.stdin.close()
        assert proc.stdout.read() == ""
        assert proc.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        proc.kill()
    assert all(reply.get("jsonrpc") == "2.0" for reply in replies), replies
    by_id = {reply.get("id"): reply for reply in replies}
    assert by_id[1]["result"]["serverInfo"]["name"] == "ssindex"
    hit = json.loads(by_id[2]["result"]["content"][0]["text"])["results"][0]
    assert hit["path"] == "numbers.py"


def test_serve_without_index_fails_cleanly(tmp_path: Path) -> None:
    proc = subprocess.run([CLI, "serve", "--index", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=300, input="")
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "no index" in proc.stderr


def test_reopens_after_a_rebuild(tmp_path: Path) -> None:
    """A long-lived server follows HEAD: a rebuild's new version is served on the next call."""
    from ssindex.tools.serve import WarmSearcher

    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    searcher = WarmSearcher(Path(build(tmp_path)["index"]))
    query = "exponential backoff when a call fails"
    assert "retry.py" not in {h["path"] for h in searcher.search(query, k=5)["results"]}

    (tmp_path / "retry.py").write_text(
        "import time\n\n\ndef call_with_backoff(fn, attempts=5):\n"
        "    for attempt in range(attempts):\n        try:\n            return fn()\n"
        "        except OSError:\n            time.sleep(2 ** attempt)\n", encoding="utf-8")
    build(tmp_path)
    assert searcher.search(query, k=5)["results"][0]["path"] == "retry.py"
