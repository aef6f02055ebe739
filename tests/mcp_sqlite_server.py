"""A tiny read-only SQLite MCP server (stdio), for the MCP client tests (tests/test_mcp_client.py).

    python tests/mcp_sqlite_server.py DB_PATH

Tools: `list_tables`, `query` (one SELECT, read-only: the database is opened with mode=ro),
`describe` (a long text of `n` characters: the result-size cap) and `secret_env` (a variable of
the server's own environment: the config's env reaches the server, and only the server). With RECURSA_TEST_PIDFILE set, it writes its pid there (the tests check
that the server is stopped when its run ends).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

DB = sys.argv[1] if len(sys.argv) > 1 else ":memory:"
server = MCPServer("sqlite-ro")


def _connect() -> sqlite3.Connection:
    return sqlite3.connect(f"file:{DB}?mode=ro", uri=True)


@server.tool()
def list_tables() -> list[str]:
    """The tables of the database."""
    with _connect() as db:
        return [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                         "ORDER BY name")]


@server.tool()
def query(sql: str, limit: int = 100) -> list[dict[str, Any]]:
    """Run one read-only SQL SELECT and return its rows as dicts.

    Args:
        sql: the SELECT statement.
        limit: the most rows returned.
    """
    with _connect() as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute(sql).fetchmany(limit)]


@server.tool()
def describe(n: int) -> str:
    """A description `n` characters long."""
    return "x" * n


@server.tool()
def secret_env(name: str = "RECURSA_TEST_SECRET") -> str:
    """An environment variable as this server sees it ("" when unset)."""
    return os.environ.get(name, "")


if __name__ == "__main__":
    if os.environ.get("RECURSA_TEST_PIDFILE"):
        with open(os.environ["RECURSA_TEST_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    server.run()
