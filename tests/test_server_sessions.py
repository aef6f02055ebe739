"""Sessions in `recursa serve`: conversation keys, the LRU + TTL pool, and reuse over HTTP."""

from __future__ import annotations

import pytest

from helpers_scripted import repl, root_script
from helpers_wait import wait_until
from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.server.sessions import SessionPool, chat_turn, conversation_key

pytest.importorskip("uvicorn")
from helpers_server import CountingSandboxes, Scripted, code, make_server  # noqa: E402

CTX = "alpha beta gamma\n" * 50


def test_conversation_key_ignores_edge_whitespace_and_text_part_shape():
    a = [{"role": "user", "content": "What is x?"}, {"role": "assistant", "content": "42\n"}]
    b = [{"role": "user", "content": [{"type": "text", "text": " What is x? "}]},
         {"role": "assistant", "content": "42"}]
    assert conversation_key(a) == conversation_key(b)
    assert conversation_key(a) != conversation_key(a, scope="other sub-model")
    c = [{"role": "user", "content": "What is y?"}, a[1]]
    assert conversation_key(a) != conversation_key(c)


def test_chat_turn_continues_only_answered_conversations_without_new_context():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    t = chat_turn(msgs, 3, new_context=False, scope=None)
    assert t is not None and t.prefix_key == conversation_key(msgs[:3])
    t = chat_turn(msgs, 3, new_context=True, scope=None)
    assert t is not None and t.prefix_key is None
    # a first question (only a system prompt before it) continues nothing
    t = chat_turn(msgs[:2], 1, new_context=False, scope=None)
    assert t is not None and t.prefix_key is None
    # a prefilled reply after the question: no session at all
    assert chat_turn(msgs, 1, new_context=False, scope=None) is None


def session(rlm_replies=('FINAL("ok")',), **kw):
    rlm = RLM(model=ReplayClient(root_script(*(repl(r) for r in rlm_replies))),
              sandbox="inprocess")
    s = rlm.session(CTX, **kw)
    s.completion("start")
    return s


def test_pool_evicts_the_least_recently_used_and_closes_it():
    pool = SessionPool(max_sessions=2, ttl_s=600)
    s1, s2, s3 = session(), session(), session()
    pool.put("k1", s1)
    pool.put("k2", s2)
    assert pool.take("k1") is s1       # taken out: k2 is now the oldest
    pool.put("k1", s1)
    pool.put("k3", s3)
    assert wait_until(lambda: s2.closed), "the evicted session was not closed"
    assert "eviction" in (s2.closed_reason or "")
    assert pool.take("k2") is None and len(pool) == 2 and pool.evicted == 1
    assert not s1.closed and not s3.closed
    pool.close_all()
    assert s1.closed and s3.closed and len(pool) == 0


def test_pool_puts_under_one_key_leave_one_open_sandbox():
    """Five sessions filed under one conversation (five clients that sent it at once): the pool
    holds one, and the four it replaced are closed, sandboxes and all."""
    boxes = CountingSandboxes()
    rlm = RLM(model=ReplayClient(root_script(*(repl('FINAL("ok")') for _ in range(5)))),
              sandbox=boxes)
    pool = SessionPool(max_sessions=3, ttl_s=600)
    sessions = []
    for _ in range(5):
        s = rlm.session(CTX)
        s.completion("start")
        sessions.append(s)
        pool.put("k", s)
        pool.put("k", s)           # the same session again: kept, not closed
    assert boxes.started == 5
    assert wait_until(lambda: boxes.open == 1), f"{boxes.open} sandboxes open"
    assert len(pool) == 1 and pool.take("k") is sessions[-1] and not sessions[-1].closed
    assert all(s.closed for s in sessions[:-1])
    # one session filed under two keys is one entry (evicting one key would close it for both)
    pool.put("a", sessions[-1])
    pool.put("b", sessions[-1])
    assert len(pool) == 1 and pool.take("a") is None and pool.take("b") is sessions[-1]
    sessions[-1].close()
    assert boxes.open == 0


def test_a_session_that_times_out_as_it_is_taken_gives_way_to_a_new_one():
    """The idle timeout may strike between the pool's `take` and the question: the question is
    asked in a new session (it used to fail the request with a 500)."""
    import asyncio

    from recursa.server.sessions import Turn, ask

    class Racy(SessionPool):
        def take(self, key):
            s = super().take(key)
            if s is not None:
                s.close()          # as its idle timer would, a moment after `take`
            return s

    pool = Racy(max_sessions=4, ttl_s=600)
    old = session()
    msgs = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    pool.put(conversation_key(msgs), old)
    fresh = []

    def make():
        fresh.append(session())
        return fresh[-1]
    turn = Turn(conversation_key(msgs), [*msgs, {"role": "user", "content": "q2"}], None)
    res, info = asyncio.run(ask(pool, turn, make, "q2", on_event=None, limits={}))
    assert res.answer == "ok" and info["reused"] is False and info["id"] == fresh[0].id
    assert old.closed and len(pool) == 1
    pool.close_all()


def test_pool_forgets_a_session_that_timed_out():
    pool = SessionPool(max_sessions=4, ttl_s=600)
    s = session(idle_timeout=0.2)
    pool.put("k", s)
    assert wait_until(lambda: s.closed), "the idle session did not close"
    assert len(pool) == 0            # what /health reports: no stale count
    assert pool.take("k") is None


# ---------------------------------------------------------------- over HTTP
def x_root(messages):
    """Q 'set x' sets a variable; 'x plus one' reads it (NameError -> 'no x' when absent)."""
    first = messages[1]["content"]
    if "Query: set x" in first:
        return code("x = 41\nFINAL('x is set')")
    return code("FINAL(str(x + 1) if 'x' in globals() else 'no x')")


def ask_http(srv, messages, **kw):
    resp = srv.client().chat.completions.create(model="recursa", messages=messages, **kw)
    return resp.choices[0].message.content, resp.model_extra["recursa"]["session"]


Q1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "set x"}]


def test_follow_up_with_the_same_prefix_continues_the_session():
    boxes = CountingSandboxes()
    with make_server(Scripted(x_root), boxes, sessions=4) as srv:
        a1, s1 = ask_http(srv, Q1)
        assert a1 == "x is set" and s1["reused"] is False and s1["question"] == 1
        # the client sends the conversation again, its answer included (whitespace trimmed)
        follow = [*Q1, {"role": "assistant", "content": a1 + "\n"},
                  {"role": "user", "content": "x plus one"}]
        a2, s2 = ask_http(srv, follow)
        assert a2 == "42" and s2 == {"id": s1["id"], "question": 2, "reused": True}
        assert boxes.started == 1 and boxes.open == 1
        # an edited earlier turn is another conversation: a new session, without `x`
        edited = [*Q1, {"role": "assistant", "content": "something else"},
                  {"role": "user", "content": "x plus one"}]
        a3, s3 = ask_http(srv, edited)
        assert a3 == "no x" and s3["reused"] is False and s3["id"] != s1["id"]
        # the first conversation goes on, streamed this time
        again = [*follow, {"role": "assistant", "content": a2},
                 {"role": "user", "content": "x plus one, again"}]
        chunks = list(srv.client().chat.completions.create(
            model="recursa", messages=again, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        final = [c.model_extra["recursa"] for c in chunks if c.model_extra.get("recursa")]
        assert text == "42" and final[-1]["session"]["question"] == 3
        assert boxes.started == 2
        assert srv.app.state.sessions is not None and len(srv.app.state.sessions) == 2


def test_server_evicts_the_least_recently_used_session_and_closes_its_sandbox():
    boxes = CountingSandboxes()
    with make_server(Scripted(x_root), boxes, sessions=1) as srv:
        a1, s1 = ask_http(srv, [{"role": "user", "content": "set x"}])
        ask_http(srv, [{"role": "user", "content": "set x"}, {"role": "assistant", "content": "?"},
                       {"role": "user", "content": "x plus one"}])   # another conversation
        assert wait_until(lambda: boxes.closed == 1), "the evicted sandbox was not closed"
        a2, s2 = ask_http(srv, [{"role": "user", "content": "set x"},
                                {"role": "assistant", "content": a1},
                                {"role": "user", "content": "x plus one"}])
        assert a2 == "no x" and s2["reused"] is False
        assert srv.app.state.sessions.evicted >= 1


def test_server_session_ttl_closes_the_sandbox():
    boxes = CountingSandboxes()
    with make_server(Scripted(x_root), boxes, sessions=4, session_ttl_s=0.3) as srv:
        a1, _ = ask_http(srv, [{"role": "user", "content": "set x"}])
        assert wait_until(lambda: boxes.closed == 1), "the idle session kept its sandbox"
        a2, s2 = ask_http(srv, [{"role": "user", "content": "set x"},
                                {"role": "assistant", "content": a1},
                                {"role": "user", "content": "x plus one"}])
        assert a2 == "no x" and s2["reused"] is False
