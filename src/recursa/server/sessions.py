"""Sessions for `recursa serve`: a conversation whose earlier turns come back keeps its sandbox.

Chat clients send the whole conversation with every request. After answering, the server files
the session under a key of the messages it has seen plus its own answer; a later request whose
messages before the final user message hash to that key continues the same session (the REPL's
variables, the loaded context, `session_history`). Anything else (an edited earlier turn,
another sub-model, a new document pasted into the question) starts afresh.

The pool is bounded: at most `max_sessions` idle sessions (the least recently used one is
closed first) and each closes its sandbox after `ttl_s` seconds unused. A session being used
is taken out of the pool, so eviction never cuts a running question.

Idle sessions also share the server's one memory and process budget with the running
questions (recursa.sandbox.budgets: every open sandbox's run commits its caps against the
process's totals, which default to what fits the machine). When a new run's caps do not fit,
the pool closes its least recently used idle session to make room, one at a time, before the
run waits or is refused.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recursa.base.types import Event, Result
    from recursa.core.session import Session


def _norm_content(content: Any) -> Any:
    """A message's content as it matters for identity: text parts stripped (clients trim the
    answer they send back), other parts (files) as they are."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        out: list[Any] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text") or "").strip())
            else:
                out.append(part)
        if all(isinstance(p, str) for p in out):   # text parts only: as one string
            return "\n".join(p for p in out if p)
        return out
    return content


def conversation_key(messages: Sequence[dict[str, Any]], scope: Any = None) -> str:
    """sha256 of the messages' roles and contents (and `scope`: what else must match)."""
    norm = [[str(m.get("role", "user")), _norm_content(m.get("content"))] for m in messages]
    data = json.dumps([scope, norm], ensure_ascii=True, sort_keys=True, default=str)
    return hashlib.sha256(data.encode()).hexdigest()


class SessionPool:
    """Idle sessions by conversation key, LRU-bounded; thread-safe."""

    def __init__(self, max_sessions: int = 16, ttl_s: float = 600.0):
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if ttl_s <= 0:
            raise ValueError("the session TTL must be positive")
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0
        self.reclaimed = 0      # closed to make room for a run in the memory budget
        from recursa.sandbox.budgets import HOST
        HOST.add_reclaimer(self.reclaim)    # held weakly: a pool that goes is forgotten

    def __len__(self) -> int:
        """Idle sessions still open (those that timed out since are forgotten here)."""
        with self._lock:
            self._forget_closed()
            return len(self._items)

    def _forget_closed(self) -> None:
        for k in [k for k, s in self._items.items() if s.closed]:   # timed out meanwhile
            del self._items[k]

    def take(self, key: str) -> Session | None:
        """The session filed under `key`, out of the pool (None if none, or it timed out)."""
        with self._lock:
            s = self._items.pop(key, None)
        return None if s is None or s.closed else s

    def put(self, key: str, session: Session) -> None:
        """File `session` under `key`; close the least recently used beyond the bound, and a
        session already filed under `key` (two clients that sent the same conversation: the
        later answer wins, the earlier sandbox is not left open until its TTL)."""
        if session.closed:
            return
        with self._lock:
            self._forget_closed()
            for k in [k for k, s in self._items.items() if s is session]:  # one key each
                del self._items[k]
            replaced = self._items.pop(key, None)
            self._items[key] = session
            victims = []
            while len(self._items) > self.max_sessions:
                victims.append(self._items.popitem(last=False)[1])
            self.evicted += len(victims)
        if replaced is not None:
            _close_later(replaced, "by the server (another session was filed under its "
                                   "conversation)")
        for s in victims:
            _close_later(s, f"on eviction (the server keeps at most {self.max_sessions} "
                            f"idle sessions)")

    def reclaim(self) -> bool:
        """Close the least recently used idle session, for a run that needs room in the
        server's memory budget; False when no session is idle."""
        with self._lock:
            self._forget_closed()
            if not self._items:
                return False
            _, victim = self._items.popitem(last=False)
            self.evicted += 1
            self.reclaimed += 1
        _close_later(victim, "to make room in the server's memory budget for another run")
        return True

    def close_all(self) -> None:
        with self._lock:
            items, self._items = list(self._items.values()), OrderedDict()
        for s in items:
            s.close()

    async def aclose_all(self) -> None:
        """close_all from async code (a server's shutdown), sessions on its loop included."""
        with self._lock:
            items, self._items = list(self._items.values()), OrderedDict()
        for s in items:
            await s.aclose()


def _answered(messages: Sequence[dict[str, Any]]) -> bool:
    return any(m.get("role") == "assistant" for m in messages)


def _lapsed(session: Session, error: BaseException) -> bool:
    """Whether `error` only says the session closed itself (its idle timeout) before the
    question began: SessionClosed, or its pending question cancelled while this task was not."""
    import asyncio

    from recursa.core.session import SessionClosed
    task = asyncio.current_task()
    return session.closed and (isinstance(error, SessionClosed) or (
        isinstance(error, asyncio.CancelledError) and task is not None
        and task.cancelling() == 0))


def _close_later(session: Session, reason: str) -> None:
    """Close in a thread: closing waits for the sandbox, the server's loop must not."""
    threading.Thread(target=session._shutdown, args=(reason,), daemon=True,
                     name="recursa-session-close").start()


@dataclass
class Turn:
    """What a chat request means for sessions: the key of the conversation before its final
    user message (None: sessions do not apply), and the messages up to that message."""

    prefix_key: str | None
    upto: list[dict[str, Any]]
    scope: Any


def chat_turn(messages: Sequence[dict[str, Any]], last: int, *, new_context: bool,
              scope: Any) -> Turn | None:
    """What sessions make of a request whose final user message is `messages[last]`: None
    when messages follow it (a prefilled reply: no session); else the key of the conversation
    it continues, if any. A new document or files in that message start a new session (the
    context differs), which the next request can continue."""
    if last != len(messages) - 1:
        return None
    upto = [dict(m) for m in messages[:last + 1]]
    if new_context or not _answered(messages[:last]):
        return Turn(None, upto, scope)
    return Turn(conversation_key(messages[:last], scope), upto, scope)


async def ask(pool: SessionPool, turn: Turn, make: Callable[[], Session], query: str,
              *, on_event: Callable[[Event], Any] | None, limits: dict[str, Any],
              output: Any = None) -> tuple[Result, dict[str, Any]]:
    """Answer `query` in the session the conversation continues (or a new one from `make`),
    then file the session under the conversation including this answer. A question cancelled
    or failed without an answer files it back under the key the client will send again."""
    taken = pool.take(turn.prefix_key) if turn.prefix_key else None
    reused = taken is not None
    session = taken if taken is not None else make()
    def file_for_retry() -> None:
        # the client will send this conversation again; a first question's session is not
        # kept (its key would be just a system prompt, which other conversations share)
        if _answered(turn.upto[:-1]):
            pool.put(conversation_key(turn.upto[:-1], turn.scope), session)
        else:
            _close_later(session, "by the server (its first question got no answer)")
    while True:
        try:
            res = await session.acompletion(query, output=output, on_event=on_event, **limits)
            break
        except BaseException as e:
            if reused and _lapsed(session, e):
                # its idle timeout struck between `take` and the question (nothing ran): the
                # conversation goes on in a new session rather than failing
                session, reused = make(), False
                continue
            file_for_retry()
            raise
    if res.status == "error" and not res.answer:
        file_for_retry()
    else:
        pool.put(conversation_key([*turn.upto, {"role": "assistant", "content": res.answer}],
                                  turn.scope), session)
    return res, {"id": session.id, "question": len(session.history), "reused": reused}
