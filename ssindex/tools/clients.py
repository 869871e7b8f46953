"""``ssindex mcp-config``: the snippet that registers ``ssindex serve --watch`` with a
coding agent. It is printed, never written into the user's files.

Each client's format, as its documentation gives it:

- ``claude``: JSON ``mcpServers``, for ``.mcp.json`` at the repository root (Claude
  Code); or the ``claude mcp add`` line printed beside it.
- ``cursor``: JSON ``mcpServers``, for ``.cursor/mcp.json`` or ``~/.cursor/mcp.json``.
- ``codex``: TOML ``[mcp_servers.NAME]``, for ``~/.codex/config.toml`` or a trusted
  project's ``.codex/config.toml``.
- ``generic``: JSON, a stdio server's command and arguments.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ssindex.errors import ConfigError

CLIENTS = ("claude", "codex", "cursor", "generic")
SERVER_NAME = "ssindex"


@dataclass(frozen=True)
class Snippet:
    text: str
    """The configuration itself (stdout)."""
    where: str
    """Where it goes, for the user (stderr)."""


def server_command(root: Path, index: Path | None) -> list[str]:
    """The command line that serves ``root``'s index and keeps it current: the
    ``ssindex`` being run now, by absolute path, so the client needs no PATH."""
    program = shutil.which("ssindex") or str(Path(sys.argv[0]).resolve())
    command = [program, "serve", "--watch", "--root", str(root)]
    return command + (["--index", str(index)] if index is not None else [])


def snippet(client: str, root: Path, index: Path | None = None) -> Snippet:
    if client not in CLIENTS:
        raise ConfigError(f"unknown client {client!r} (clients: {', '.join(CLIENTS)})")
    program, *args = server_command(root.resolve(), index.resolve() if index else None)
    entry = {"command": program, "args": args}
    if client == "codex":
        text = (f"[mcp_servers.{SERVER_NAME}]\ncommand = {json.dumps(program)}\n"
                f"args = {json.dumps(args)}\n")
        return Snippet(text, "add to ~/.codex/config.toml (or .codex/config.toml of a "
                             "trusted project)")
    if client == "generic":
        return Snippet(json.dumps({"name": SERVER_NAME, "transport": "stdio", **entry},
                                  indent=2) + "\n",
                       "give the client this stdio server's command and args")
    text = json.dumps({"mcpServers": {SERVER_NAME: entry}}, indent=2) + "\n"
    if client == "cursor":
        return Snippet(text, "merge into .cursor/mcp.json of the project (or "
                             "~/.cursor/mcp.json)")
    added = shlex.join(["claude", "mcp", "add", SERVER_NAME, "--", program, *args])
    return Snippet(text, f"merge into .mcp.json at the repository root, or run: {added}")
