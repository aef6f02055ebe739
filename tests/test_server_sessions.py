"""Sessions in `recursa serve`: conversation keys, the LRU + TTL pool, and reuse over HTTP."""

from __future__ import annotations

import threading

from recursa import RLM
from recursa.models.replay import ReplayClient
from recursa.server.sessions import SessionPool, chat_turn, conversation_key
from test_loop import repl, root_script

CTX = "alpha beta gamma\n" * 50


def wait_for(cond, seconds: float = 10.0) -> bool:
    done = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if cond():
            return True
        done.wait(0.05)
    return cond()


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
    assert wait_for(lambda: s2.closed), "the evicted session was not closed"
    assert "eviction" in (s2.closed_reason or "")
    assert pool.take("k2") is None and len(pool) == 2 and pool.evicted == 1
    assert not s1.closed and not s3.closed
    pool.close_all()
    assert s1.closed and s3.closed and len(pool) == 0


def test_pool_forgets_a_session_that_timed_out():
    pool = SessionPool(max_sessions=4, ttl_s=600)
    s = session(idle_timeout=0.2)
    pool.put("k", s)
    assert wait_for(lambda: s.closed), "the idle session did not close"
    assert pool.take("k") is None
