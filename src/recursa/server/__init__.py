"""Serving an RLM to tools that know nothing about recursa.

* `recursa.server.openai_app` — an OpenAI-compatible HTTP API (`/v1/models`,
  `/v1/chat/completions`), built with `create_app(ServerConfig(...))`.
* `recursa.server.mcp_server` — an MCP server (stdio) with one tool, `rlm_answer`.

Both need the optional extra: `pip install 'recursa[serve]'`. Nothing here is imported by
`import recursa`, so the core library works without them.
"""
