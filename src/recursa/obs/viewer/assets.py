"""The viewer page: HTML skeleton, CSS and vanilla JavaScript, inlined into every HTML file.

Kept as Python strings (not package data files) so a wheel ships them with no packaging config.
The script builds the tree from raw trace events (the same pairing rules as `recursa.obs.trace`), so
the static page and `--live` (which appends events as they are polled) share one code path.
All trace text is inserted with textContent, never as HTML: model output cannot run script.
"""

CSS = r"""
:root{--bg:#fbfbfc;--fg:#1d2330;--mut:#6b7385;--line:#e3e6ec;--sel:#e5efff;--hit:#ffe58a;
--run:#5b6cff;--child:#a855f7;--turn:#0ea5e9;--cell:#10b981;--subcall:#f59e0b;--err:#e11d48;
--mono:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace}
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg);height:100vh;display:flex;flex-direction:column;overflow:hidden}
header{padding:8px 12px;border-bottom:1px solid var(--line);background:#fff}
.top{display:flex;gap:10px;align-items:center;flex-wrap:wrap}
.top h1{font-size:15px;margin:0;font-weight:600}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;font-size:11px;font-weight:600;
color:#fff;background:var(--mut)}
.badge.final{background:#16a34a}.badge.extracted{background:#ca8a04}.badge.limit{background:#ea580c}
.badge.error{background:var(--err)}.badge.open{background:#64748b}
#live{font-size:11px;color:var(--mut)}
#search{margin-left:auto;width:280px;padding:4px 8px;border:1px solid var(--line);border-radius:6px;
font:inherit}
#query{color:var(--mut);margin-top:2px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#totals{display:flex;gap:14px;flex-wrap:wrap;margin-top:6px}
#totals .m b{font-variant-numeric:tabular-nums}
#totals .m span{color:var(--mut)}
#answer{margin-top:6px;max-height:84px;overflow:auto;background:#f4f6f9;border-radius:6px;
padding:4px 8px;white-space:pre-wrap;font-family:var(--mono);font-size:12px}
#answer.full{max-height:40vh}
main{flex:1;display:flex;min-height:0}
#left{width:46%;min-width:320px;display:flex;flex-direction:column;border-right:1px solid var(--line)}
#tree,#results{flex:1;overflow:auto;padding:4px 0}
#results{display:none;border-bottom:1px solid var(--line);flex:0 1 auto;max-height:40%;background:#fffdf3}
#results.on{display:block}
#results .hit{padding:3px 10px;cursor:pointer;border-bottom:1px solid #f1efe2}
#results .hit:hover{background:var(--sel)}
#results .snip{font-family:var(--mono);font-size:11px;color:var(--mut);white-space:pre-wrap;
word-break:break-all}
mark{background:var(--hit);color:inherit}
pre.code mark{background:#facc15;color:#111}
.kids{margin-left:14px;border-left:1px dotted #d4d8e0}
.row{display:flex;align-items:center;gap:6px;padding:1px 8px 1px 4px;cursor:pointer;white-space:nowrap}
.row:hover{background:#f1f4f9}.row.sel{background:var(--sel)}
.tw{width:12px;color:var(--mut);flex:none;text-align:center}
.kind{font-size:10px;font-weight:700;text-transform:uppercase;padding:0 4px;border-radius:3px;
color:#fff;flex:none}
.k-run{background:var(--run)}.k-child{background:var(--child)}.k-turn{background:var(--turn)}
.k-cell{background:var(--cell)}.k-subcall{background:var(--subcall)}.k-other{background:var(--mut)}
.title{overflow:hidden;text-overflow:ellipsis;flex:1;min-width:40px}
.met{color:var(--mut);font-size:11px;font-variant-numeric:tabular-nums;flex:none}
.flag{font-size:10px;font-weight:700;color:var(--err);flex:none}
.flag.open{color:#64748b}
.more{margin:2px 0 2px 22px;font-size:11px;cursor:pointer;color:var(--run);background:none;
border:1px solid var(--line);border-radius:4px}
#detail{flex:1;overflow:auto;padding:8px 14px;min-width:0}
#detail h2{font-size:14px;margin:2px 0 6px}
#detail h3{font-size:12px;margin:12px 0 4px;color:var(--mut);text-transform:uppercase}
#detail table{border-collapse:collapse;font-size:12px}
#detail td,#detail th{padding:1px 10px 1px 0;text-align:left;vertical-align:top}
#detail th{color:var(--mut);font-weight:500}
pre{margin:0;padding:6px 8px;background:#f4f6f9;border-radius:6px;white-space:pre-wrap;
word-break:break-word;font:12px/1.45 var(--mono);max-height:60vh;overflow:auto}
pre.code{background:#0f172a;color:#e2e8f0}
pre.out{background:#f5f7ec}
pre.bad{background:#fdecef}
.show{font-size:11px;margin-top:3px}
#tl{height:34vh;min-height:150px;border-top:1px solid var(--line);display:flex;flex-direction:column;
background:#fff}
#tl-head{display:flex;align-items:center;gap:12px;padding:3px 10px;font-size:11px;color:var(--mut);
border-bottom:1px solid var(--line)}
#tl-axis{position:relative;height:16px;margin-left:300px;margin-right:12px;font-size:10px;color:var(--mut)}
#tl-axis span{position:absolute;transform:translateX(-50%)}
#tl-body{flex:1;overflow:auto;position:relative}
#tl-spacer{position:relative}
.tl-row{position:absolute;left:0;right:0;height:18px;display:flex;align-items:center;cursor:pointer;
font-size:11px}
.tl-row:hover{background:#f1f4f9}.tl-row.sel{background:var(--sel)}
.tl-lab{width:300px;flex:none;overflow:hidden;white-space:nowrap;text-overflow:ellipsis;padding-right:6px}
.tl-track{position:relative;flex:1;height:12px;margin-right:12px}
.tl-bar{position:absolute;top:1px;height:10px;border-radius:2px;min-width:2px;opacity:.85}
.tl-bar.open{background-image:repeating-linear-gradient(45deg,rgba(255,255,255,.5) 0 4px,transparent 4px 8px)}
.b-run{background:var(--run)}.b-child{background:var(--child)}.b-turn{background:var(--turn)}
.b-cell{background:var(--cell)}.b-subcall{background:var(--subcall)}.b-other{background:var(--mut)}
.b-err{background:var(--err)}
.usage td{font-variant-numeric:tabular-nums}
.badge.src-ok{background:#16a34a;cursor:pointer}.badge.src-bad{background:var(--err);cursor:pointer}
.src{margin:6px 0}.src .head{font-size:12px;margin-bottom:2px}
.src.bad .head{color:var(--err);font-weight:600}
pre.src-text mark.passage{background:#bbf7d0;outline:1px solid #16a34a}
pre.src-text .ctx{color:var(--mut)}
.empty{color:var(--mut);padding:10px}
"""

JS = r"""
(function () {
"use strict";
const CFG = JSON.parse(document.getElementById("recursa-config").textContent);
const PAGE = 200;            // tree children rendered per "show more"
const TEXT_CAP = 20000;      // characters shown before "show all"
const ROW_H = 18;            // timeline row height (px)
const TEXT_FIELDS = ["query", "text", "code", "output", "prompt", "response", "answer", "error",
                     "description"];

// ------------------------------------------------------------------ model
let M;
function reset(runId) {
  M = {runId: runId, nodes: new Map(), order: [], points: [], roots: [], root: null, nEvents: 0,
       lastT: null, format: null, dfs: [], totals: null, byModel: {}, byRole: {}, final: null,
       context: null, peak: 0};
}
reset(null);

function ingest(ev) {
  if (!ev || typeof ev !== "object") return;
  if (ev.kind === "header") { if (!M.runId || ev.run_id === M.runId) M.format = ev.format; return; }
  if (M.runId === null) M.runId = ev.run_id;
  if (ev.run_id !== M.runId) {
    // a new top-level run appended to the same file: follow it
    if (ev.kind === "run" && ev.phase === "start" && !ev.parent) reset(ev.run_id); else return;
  }
  M.nEvents++;
  if (typeof ev.t === "number") M.lastT = M.lastT === null ? ev.t : Math.max(M.lastT, ev.t);
  const data = ev.data || {};
  if (ev.phase === "point") { M.points.push(ev); return; }
  let n = M.nodes.get(ev.id);
  if (!n) {
    n = {id: ev.id, kind: ev.kind, parent: ev.parent, depth: ev.depth || 0, start: null, end: null,
         data: {}, kids: [], points: [], agg: null, lvl: 0, blob: null};
    M.nodes.set(ev.id, n); M.order.push(n);
  }
  if (ev.phase === "start") { n.start = ev.t; n.data = Object.assign({}, data, n.data); }
  else if (ev.phase === "update") { Object.assign(n.data, data); }
  else { n.end = ev.t; Object.assign(n.data, data); if (n.start === null) n.start = ev.t; }
  if (!n.parent && ev.parent) n.parent = ev.parent;
}

function isCall(n) { return (n.kind === "turn" || n.kind === "subcall") && !!n.data.usage; }
function usageOf(n) {
  const u = n.data.usage || {};
  return {i: +u.input_tokens || 0, o: +u.output_tokens || 0, c: +u.cached_tokens || 0};
}
function addCost(a, c) { return (a === null || c === null || c === undefined) ? null : a + c; }
function addRole(tab, key, u, cost) {
  const r = tab[key] || (tab[key] = {calls: 0, i: 0, o: 0, c: 0, cost: 0});
  r.calls++; r.i += u.i; r.o += u.o; r.c += u.c; r.cost = addCost(r.cost, cost);
}

function finalize() {
  const roots = [];
  for (const n of M.order) { n.kids = []; n.points = []; n.blob = null; }
  for (const n of M.order) {
    const p = n.parent ? M.nodes.get(n.parent) : null;
    if (p && p !== n) p.kids.push(n); else roots.push(n);
  }
  M.roots = roots;
  M.root = roots.find(function (r) { return r.kind === "run"; }) || roots[0] || null;
  for (const ev of M.points) {
    const p = M.nodes.get(ev.parent) || M.root;
    if (p) p.points.push(ev);
  }
  const T = {i: 0, o: 0, c: 0, cost: 0, calls: 0, turns: 0, cells: 0, subcalls: 0, failed: 0,
             children: 0};
  M.byModel = {}; M.byRole = {};
  // children start after their parents, so walking backwards finishes kids before parents
  for (let k = M.order.length - 1; k >= 0; k--) {
    const n = M.order[k];
    const a = n.agg = {i: 0, o: 0, cost: 0, calls: 0};
    for (const c of n.kids) {
      a.i += c.agg.i; a.o += c.agg.o; a.calls += c.agg.calls; a.cost = addCost(a.cost, c.agg.cost);
    }
    T.turns += n.kind === "turn"; T.cells += n.kind === "cell"; T.children += n.kind === "child";
    if (n.kind === "subcall") { T.subcalls++; if (n.data.error) T.failed++; }
    if (!isCall(n)) continue;
    const u = usageOf(n), cost = n.data.cost_usd;
    a.i += u.i; a.o += u.o; a.calls++; a.cost = addCost(a.cost, cost);
    T.i += u.i; T.o += u.o; T.c += u.c; T.calls++; T.cost = addCost(T.cost, cost);
    let role, model;
    if (n.kind === "subcall") { role = "sub"; model = n.data.model; }
    else {
      role = n.depth === 0 ? "root" : "child";
      const p = M.nodes.get(n.parent);
      model = n.data.model || (p && p.data.model);   // the last-answer turn names no model
    }
    addRole(M.byRole, role, u, cost); addRole(M.byModel, model || "unknown", u, cost);
  }
  // depth-first order and nesting level, for the timeline
  M.dfs = [];
  const stack = roots.slice().reverse().map(function (r) { return [r, 0]; });
  while (stack.length) {
    const [n, lvl] = stack.pop();
    n.lvl = lvl; M.dfs.push(n);
    for (let j = n.kids.length - 1; j >= 0; j--) stack.push([n.kids[j], lvl + 1]);
  }
  M.final = null; M.context = null;
  const r = M.root;
  if (r) {
    for (const p of r.points) {
      if (p.kind === "final") M.final = p.data || {};
      else if (p.data && p.data.context_sha256) M.context = p.data;
    }
  }
  T.start = r ? r.start : null;
  T.end = r ? (r.end !== null ? r.end : M.lastT) : M.lastT;
  T.wall = (T.start !== null && T.end !== null) ? Math.max(0, T.end - T.start) : 0;
  M.totals = T;
  // peak number of sub-calls in flight at once (sweep over start/end times)
  const ev = [];
  for (const n of M.order) if (n.kind === "subcall" && n.start !== null) {
    ev.push([n.start, 1]); ev.push([n.end !== null ? n.end : T.end, -1]);
  }
  ev.sort(function (x, y) { return x[0] - y[0] || x[1] - y[1]; });
  let cur = 0, peak = 0;
  for (const e of ev) { cur += e[1]; if (cur > peak) peak = cur; }
  M.peak = peak;
}

// ------------------------------------------------------------------ formatting
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function fmtN(x) {
  if (x >= 1e6) return (x / 1e6).toFixed(x >= 1e7 ? 0 : 1) + "M";
  if (x >= 1e3) return (x / 1e3).toFixed(x >= 1e4 ? 0 : 1) + "k";
  return String(x);
}
function fmtCost(c) { return c === null || c === undefined ? "cost ?" : "$" + c.toFixed(c < 1 ? 4 : 2); }
function fmtDur(s) {
  if (s === null || s === undefined || isNaN(s)) return "";
  if (s < 1) return Math.round(s * 1000) + "ms";
  if (s < 120) return s.toFixed(s < 10 ? 2 : 1) + "s";
  return Math.floor(s / 60) + "m" + String(Math.round(s % 60)).padStart(2, "0") + "s";
}
function dur(n) {
  if (n.start === null) return null;
  const end = n.end !== null ? n.end : M.totals.end;
  return Math.max(0, end - n.start);
}
function firstLine(s, max) {
  s = String(s || "").trim();
  const i = s.indexOf("\n");
  if (i >= 0) s = s.slice(0, i);
  return s.length > max ? s.slice(0, max) + "…" : s;
}
function proseOf(text) {
  // the model's words before its first code block make the best one-line title
  const s = String(text || "");
  const i = s.indexOf("```");
  const head = (i >= 0 ? s.slice(0, i) : s).trim();
  return head || s.trim();
}
function title(n) {
  const d = n.data;
  switch (n.kind) {
    case "run": return (d.model ? d.model + " · " : "") + firstLine(d.query, 120);
    case "child": return "child RLM · " + firstLine(d.query, 120);
    case "turn": return (d.last ? "last turn" : "turn " + (d.turn || "")) +
      (d.blocks !== undefined ? " · " + d.blocks + " block" + (d.blocks === 1 ? "" : "s") : "") +
      (d.text ? " · " + firstLine(proseOf(d.text), 100) : "");
    case "cell": return "cell " + ((d.index || 0) + 1) + " · " + firstLine(d.code, 100);
    case "subcall": return (d.model || "sub-call") + " · " + firstLine(d.prompt, 100);
    default: return n.kind;
  }
}
function metrics(n) {
  const a = n.agg, parts = [];
  if (a && a.calls) parts.push(fmtN(a.i + a.o) + " tok", fmtCost(a.cost));
  const t = dur(n);
  if (t !== null) parts.push(fmtDur(t));
  return parts.join(" · ");
}
function kindCls(k) {
  return ["run", "child", "turn", "cell", "subcall"].indexOf(k) >= 0 ? k : "other";
}

// ------------------------------------------------------------------ tree
const treeBox = document.getElementById("tree");
const expanded = new Set();
const pages = new Map();     // node id -> how many children are rendered
const wraps = new Map();     // node id -> its rendered element
let selected = null;

function rowFor(n) {
  const row = el("div", "row" + (n.id === selected ? " sel" : ""));
  row.appendChild(el("span", "tw", n.kids.length ? (expanded.has(n.id) ? "▾" : "▸") : "·"));
  row.appendChild(el("span", "kind k-" + kindCls(n.kind), n.kind === "subcall" ? "sub" : n.kind));
  row.appendChild(el("span", "title", title(n)));
  if (n.end === null) row.appendChild(el("span", "flag open", "open"));
  else if (n.data.error || n.data.timed_out) row.appendChild(el("span", "flag", n.data.timed_out ? "timeout" : "error"));
  row.appendChild(el("span", "met", metrics(n)));
  return row;
}
function nodeEl(n) {
  const w = el("div", "node");
  w.dataset.id = n.id;
  wraps.set(n.id, w);
  w.appendChild(rowFor(n));
  if (expanded.has(n.id) && n.kids.length) w.appendChild(kidsEl(n));
  return w;
}
function kidsEl(n) {
  const box = el("div", "kids");
  const lim = Math.min(n.kids.length, pages.get(n.id) || PAGE);
  const frag = document.createDocumentFragment();
  for (let i = 0; i < lim; i++) frag.appendChild(nodeEl(n.kids[i]));
  box.appendChild(frag);
  if (lim < n.kids.length) {
    const b = el("button", "more", "show " + Math.min(PAGE, n.kids.length - lim) + " more of " +
                 (n.kids.length - lim));
    b.dataset.more = n.id;
    box.appendChild(b);
  }
  return box;
}
function rerenderNode(n) {
  const w = wraps.get(n.id);
  if (!w || !w.parentNode) return;
  w.parentNode.replaceChild(nodeEl(n), w);
}
function renderTree() {
  const st = treeBox.scrollTop;
  wraps.clear();
  treeBox.textContent = "";
  if (!M.roots.length) { treeBox.appendChild(el("div", "empty", "no events yet")); return; }
  const frag = document.createDocumentFragment();
  for (const r of M.roots) frag.appendChild(nodeEl(r));
  treeBox.appendChild(frag);
  treeBox.scrollTop = st;
}
function reveal(id) {
  // expand every ancestor (and page far enough) so the node's row exists, then show it
  const path = [];
  for (let n = M.nodes.get(id); n; n = n.parent ? M.nodes.get(n.parent) : null) {
    path.unshift(n);
    if (path.length > 10000) break;
  }
  for (let i = 0; i < path.length - 1; i++) {
    const p = path[i], idx = p.kids.indexOf(path[i + 1]);
    if ((pages.get(p.id) || PAGE) <= idx) pages.set(p.id, Math.ceil((idx + 1) / PAGE) * PAGE);
    expanded.add(p.id);
  }
  // re-render from the highest ancestor that is on screen
  for (const p of path) { if (wraps.has(p.id)) { rerenderNode(p); break; } }
  const w = wraps.get(id);
  if (w) w.firstChild.scrollIntoView({block: "nearest"});
}
treeBox.addEventListener("click", function (e) {
  const more = e.target.closest("button.more");
  if (more) {
    const n = M.nodes.get(more.dataset.more);
    pages.set(n.id, (pages.get(n.id) || PAGE) + PAGE);
    rerenderNode(n);
    return;
  }
  const w = e.target.closest(".node");
  if (!w) return;
  const n = M.nodes.get(w.dataset.id);
  if (n.kids.length && (e.target.classList.contains("tw") || n.id === selected || !expanded.has(n.id))) {
    if (expanded.has(n.id)) expanded.delete(n.id); else expanded.add(n.id);
    rerenderNode(n);
  }
  select(n.id, null, false);
});

function select(id, needle, scroll) {
  const prev = selected && wraps.get(selected);
  if (prev) prev.firstChild.classList.remove("sel");
  selected = id;
  if (scroll) reveal(id);
  const w = wraps.get(id);
  if (w) w.firstChild.classList.add("sel");
  const n = M.nodes.get(id), before = scope;
  renderDetail(n, needle);
  setScope(n);
  if (scope !== before) { tlBody.scrollTop = 0; renderAxis(); }
  renderTimeline();
}

// ------------------------------------------------------------------ detail
const detail = document.getElementById("detail");
function marked(text, needle) {
  // text with every occurrence of needle wrapped in <mark>, built from text nodes only
  const frag = document.createDocumentFragment();
  if (!needle) { frag.appendChild(document.createTextNode(text)); return frag; }
  const lc = text.toLowerCase(), nd = needle.toLowerCase();
  let i = 0, j;
  while ((j = lc.indexOf(nd, i)) >= 0) {
    frag.appendChild(document.createTextNode(text.slice(i, j)));
    frag.appendChild(el("mark", null, text.slice(j, j + nd.length)));
    i = j + nd.length;
  }
  frag.appendChild(document.createTextNode(text.slice(i)));
  return frag;
}
function textBlock(label, text, cls, needle) {
  const box = el("div");
  box.appendChild(el("h3", null, label));
  text = String(text);
  const pre = el("pre", cls);
  let full = text.length <= TEXT_CAP;
  if (!full && needle && text.toLowerCase().indexOf(needle.toLowerCase()) >= TEXT_CAP) full = true;
  pre.appendChild(marked(full ? text : text.slice(0, TEXT_CAP), needle));
  box.appendChild(pre);
  if (!full) {
    const b = el("button", "show", "show all " + text.length.toLocaleString() + " characters");
    b.onclick = function () { pre.textContent = ""; pre.appendChild(marked(text, needle)); b.remove(); };
    box.appendChild(b);
  }
  return box;
}
function kv(rows) {
  const t = el("table");
  for (const [k, v] of rows) {
    if (v === undefined || v === null || v === "") continue;
    const tr = el("tr");
    tr.appendChild(el("th", null, k));
    tr.appendChild(el("td", null, v));
    t.appendChild(tr);
  }
  return t;
}
function renderDetail(n, needle) {
  detail.textContent = "";
  if (!n) return;
  const d = n.data, T = M.totals;
  detail.appendChild(el("h2", null, n.kind + " · " + title(n)));
  const u = usageOf(n), a = n.agg || {i: 0, o: 0, calls: 0, cost: 0};
  const rows = [
    ["id", n.id + (n.parent ? "  (parent " + n.parent + ")" : "")],
    ["depth", String(n.depth)],
    ["started", n.start !== null && T.start !== null ? "+" + fmtDur(n.start - T.start) : ""],
    ["duration", n.end === null ? "open (no end event: still running or killed)" : fmtDur(dur(n))],
    ["model", d.model],
  ];
  if (isCall(n)) rows.push(["tokens", u.i.toLocaleString() + " in / " + u.o.toLocaleString() + " out" +
                            (u.c ? " / " + u.c.toLocaleString() + " cached" : "")],
                           ["cost", fmtCost(d.cost_usd)], ["latency", fmtDur(d.latency_s)]);
  if (a.calls && !(isCall(n) && a.calls === 1))
    rows.push(["subtree", a.calls + " calls · " + (a.i + a.o).toLocaleString() + " tokens · " + fmtCost(a.cost)]);
  if (n.kind === "cell") {
    const flags = [];
    if (d.error) flags.push("error"); if (d.timed_out) flags.push("timed out");
    if (d.restarted) flags.push("sandbox restarted"); if (d.ready) flags.push("answer ready");
    rows.push(["cell", flags.join(", ")], ["code time", fmtDur(d.elapsed_s)]);
  }
  if (n.kind === "run" || n.kind === "child") rows.push(["status", d.status], ["turns", d.turns]);
  detail.appendChild(kv(rows));
  if (n === M.root && M.totals.calls) {
    detail.appendChild(el("h3", null, "usage by role and model"));
    detail.appendChild(usageTable());
  }
  if (d.query) detail.appendChild(textBlock("query", d.query, "", needle));
  if (n.kind === "turn" && d.text) detail.appendChild(textBlock("model text", d.text, "", needle));
  if (d.code) detail.appendChild(textBlock("code", d.code, "code", needle));
  if (d.output !== undefined && d.output !== null) detail.appendChild(textBlock("output", d.output, d.error ? "out bad" : "out", needle));
  if (d.prompt) detail.appendChild(textBlock("prompt (" + (d.prompt_chars || d.prompt.length).toLocaleString() + " chars)", d.prompt, "", needle));
  if (d.response) detail.appendChild(textBlock("answer", d.response, "out", needle));
  if (typeof d.error === "string") detail.appendChild(textBlock("error", d.error, "bad", needle));
  for (const p of n.points) {
    const pd = p.data || {};
    if (p.kind === "final") {
      detail.appendChild(textBlock("final answer · " + (pd.status || "") + (pd.ready ? " (confirmed)" : ""),
                                   pd.answer || "", "out", needle));
      if (pd.error) detail.appendChild(textBlock("error", pd.error, "bad", needle));
      if (pd.sources && pd.sources.length) detail.appendChild(sourcesBlock(pd.sources, needle));
    } else if (pd.context_sha256) {
      detail.appendChild(el("h3", null, "context"));
      detail.appendChild(kv([["sha256", pd.context_sha256],
        ["size", (pd.context_bytes || 0).toLocaleString() + " bytes, " + (pd.context_chars || 0).toLocaleString() + " chars"]]));
      if (pd.description) detail.appendChild(textBlock("description shown to the model", pd.description, "", needle));
    } else {
      detail.appendChild(textBlock(p.kind + " event", JSON.stringify(pd, null, 1), "", needle));
    }
  }
  if (d.budget && Object.keys(d.budget).length)
    detail.appendChild(textBlock("budget", JSON.stringify(d.budget, null, 1), ""));
}

// the answer's sources (recursa.core.sources): each passage highlighted in the text around it, or
// the quote the model gave, marked as not found in the context
function sourcesBlock(sources, needle) {
  const box = el("div", "sources");
  const found = sources.filter(function (s) { return s.found; }).length;
  box.appendChild(el("h3", null, "sources · " + found + " of " + sources.length + " found in the context"));
  sources.forEach(function (s, i) {
    const item = el("div", "src" + (s.found ? "" : " bad"));
    item.dataset.found = s.found ? "1" : "0";
    const loc = s.location || {};
    let head = "[" + (i + 1) + "] ";
    if (s.found) head += (loc.label || "") + " · " + s.match + (s.match === "fuzzy" ? " (score " + s.score + ")" : "");
    else {
      const why = (s.note || "").replace(/^not found in the context\s*/, "");
      head += "NOT FOUND in the context" + (why ? " · " + why : "");
    }
    if (s.found && s.note) head += " · " + s.note;
    item.appendChild(el("div", "head", head));
    const pre = el("pre", "src-text");
    if (s.found) {
      pre.appendChild(el("span", "ctx", (s.before ? "…" : "") + (s.before || "")));
      const m = el("mark", "passage");
      m.appendChild(marked(s.text || "", needle));
      pre.appendChild(m);
      pre.appendChild(el("span", "ctx", (s.after || "") + (s.after ? "…" : "")));
    } else {
      pre.classList.add("bad");
      pre.appendChild(marked(s.quote || "", needle));
    }
    item.appendChild(pre);
    box.appendChild(item);
  });
  return box;
}

// ------------------------------------------------------------------ summary
function renderSummary() {
  const T = M.totals, r = M.root, f = M.final;
  document.getElementById("runid").textContent = M.runId ? "run " + M.runId : "";
  const st = document.getElementById("status");
  const status = f && f.status ? f.status : (r && r.end !== null ? (r.data.status || "ended") : "open");
  st.textContent = status + (f && f.ready ? " ✓" : "");
  st.className = "badge " + status;
  const sb = document.getElementById("srcbadge"), srcs = f && f.sources ? f.sources : [];
  if (srcs.length) {
    const ok = srcs.filter(function (s) { return s.found; }).length;
    sb.textContent = "sources " + ok + "/" + srcs.length + (ok === srcs.length ? " ✓" : " unverified");
    sb.className = "badge " + (ok === srcs.length ? "src-ok" : "src-bad");
    sb.style.display = "";
  } else sb.style.display = "none";
  document.getElementById("query").textContent = r ? (r.data.query || "") : "";
  const tot = document.getElementById("totals");
  tot.textContent = "";
  const m = [["tokens", fmtN(T.i + T.o) + " (" + fmtN(T.i) + " in / " + fmtN(T.o) + " out)"],
             ["cost", fmtCost(T.cost)], ["calls", T.calls], ["turns", T.turns],
             ["sub-calls", T.subcalls + (T.failed ? " (" + T.failed + " failed)" : "")],
             ["children", T.children], ["wall", fmtDur(T.wall)], ["events", M.nEvents]];
  for (const [k, v] of m) {
    const s = el("span", "m"); s.dataset.k = k;
    s.appendChild(el("span", null, k + " ")); s.appendChild(el("b", null, v));
    tot.appendChild(s);
  }
  const ans = document.getElementById("answer");
  ans.textContent = f ? (f.answer || "(empty answer)") + (f.error ? "\n\nerror: " + f.error : "")
                      : "(no final answer yet)";
}
document.getElementById("answer").addEventListener("click", function () { this.classList.toggle("full"); });
document.getElementById("srcbadge").addEventListener("click", function () {
  if (!M.root) return;
  select(M.root.id, null, true);
  const box = detail.querySelector(".sources");
  if (box) box.scrollIntoView({block: "start"});
});

function usageTable() {
  const t = el("table", "usage");
  const h = el("tr");
  for (const c of ["", "calls", "input", "output", "cost"]) h.appendChild(el("th", null, c));
  t.appendChild(h);
  function add(label, tab) {
    for (const k of Object.keys(tab).sort()) {
      const r = tab[k], tr = el("tr");
      for (const c of [label + k, r.calls, r.i.toLocaleString(), r.o.toLocaleString(), fmtCost(r.cost)])
        tr.appendChild(el("td", null, c));
      t.appendChild(tr);
    }
  }
  add("role ", M.byRole); add("model ", M.byModel);
  return t;
}

// ------------------------------------------------------------------ timeline
const tlBody = document.getElementById("tl-body");
const tlSpacer = document.getElementById("tl-spacer");
let tlQueued = false;
let scope = null;            // the node whose subtree the timeline shows (null: the whole run)
function inSubtree(n, top) {
  for (let x = n; x; x = x.parent ? M.nodes.get(x.parent) : null) if (x === top) return true;
  return false;
}
function setScope(n) {
  // zoom to the selected node's subtree; a leaf keeps the current view if it is inside it
  if (!n || n === M.root) scope = null;
  else if (n.kids.length) scope = n;
  else if (!(scope && inSubtree(n, scope))) scope = n.parent ? M.nodes.get(n.parent) || null : null;
  if (scope === M.root) scope = null;
  tlRows = null;
}
let tlRows = null;
function rowsInScope() {
  if (tlRows) return tlRows;
  if (!scope) return (tlRows = M.dfs);
  const out = [], stack = [scope];
  while (stack.length) {
    const n = stack.pop(); out.push(n);
    for (let j = n.kids.length - 1; j >= 0; j--) stack.push(n.kids[j]);
  }
  return (tlRows = out);
}
function window0() {
  const T = M.totals;
  if (!scope || scope.start === null) return [T.start, Math.max(T.wall, 1e-9)];
  return [scope.start, Math.max(dur(scope) || 0, 1e-9)];
}
function renderAxis() {
  const axis = document.getElementById("tl-axis"), w = window0();
  axis.textContent = "";
  for (let i = 0; i <= 4; i++) {
    const s = el("span", null, fmtDur(w[1] * i / 4) || "0");
    s.style.left = (i * 25) + "%";
    if (i === 0) s.style.transform = "none";              // keep the end labels inside
    if (i === 4) s.style.transform = "translateX(-100%)";
    axis.appendChild(s);
  }
  const rows = rowsInScope();
  document.getElementById("tl-info").textContent = (scope ? "zoomed to " + scope.kind + " · " : "whole run · ") +
    rows.length + " spans · peak " + M.peak + " sub-calls in flight at once in the run";
  document.getElementById("tl-all").style.display = scope ? "" : "none";
}
function renderTimeline() {
  // only the rows in view are in the DOM: thousands of spans stay cheap
  const rows = rowsInScope(), w = window0(), t0 = w[0], span = w[1];
  tlSpacer.style.height = (rows.length * ROW_H) + "px";
  tlSpacer.textContent = "";
  const first = Math.max(0, Math.floor(tlBody.scrollTop / ROW_H) - 5);
  const last = Math.min(rows.length, first + Math.ceil((tlBody.clientHeight || 300) / ROW_H) + 10);
  const base = rows.length ? rows[0].lvl : 0;
  const frag = document.createDocumentFragment();
  for (let i = first; i < last; i++) {
    const n = rows[i];
    const r = el("div", "tl-row" + (n.id === selected ? " sel" : ""));
    r.style.top = (i * ROW_H) + "px";
    r.dataset.id = n.id;
    const lab = el("div", "tl-lab", title(n));
    lab.style.paddingLeft = (4 + Math.min(n.lvl - base, 20) * 10) + "px";
    r.appendChild(lab);
    const tr = el("div", "tl-track"), b = el("div", "tl-bar b-" + (n.data.error ? "err" : kindCls(n.kind)) + (n.end === null ? " open" : ""));
    const s0 = n.start !== null && t0 !== null ? n.start - t0 : 0, d = dur(n) || 0;
    b.style.left = Math.max(0, 100 * s0 / span) + "%";
    b.style.width = Math.min(100, 100 * d / span) + "%";
    b.title = n.kind + " · +" + fmtDur(s0) + " · " + fmtDur(d) + (n.end === null ? " (open)" : "");
    tr.appendChild(b); r.appendChild(tr);
    frag.appendChild(r);
  }
  tlSpacer.appendChild(frag);
}
document.getElementById("tl-all").addEventListener("click", function () {
  scope = null; tlRows = null; renderAxis(); renderTimeline();
});
tlBody.addEventListener("scroll", function () {
  if (tlQueued) return;
  tlQueued = true;
  requestAnimationFrame(function () { tlQueued = false; renderTimeline(); });
});
tlBody.addEventListener("click", function (e) {
  const r = e.target.closest(".tl-row");
  if (r) select(r.dataset.id, null, true);
});

// ------------------------------------------------------------------ search
const searchBox = document.getElementById("search"), results = document.getElementById("results");
let searchTimer = null, needle = "";
function blob(n) {
  if (n.blob === null) {
    const parts = [];
    for (const k of TEXT_FIELDS) if (n.data[k]) parts.push(String(n.data[k]));
    for (const p of n.points) for (const k of TEXT_FIELDS) if (p.data && p.data[k]) parts.push(String(p.data[k]));
    n.blob = parts.join("\n");
    n.lc = n.blob.toLowerCase();
  }
  return n.lc;
}
function runSearch() {
  needle = searchBox.value.trim();
  results.textContent = "";
  results.dataset.q = needle;
  if (needle.length < 2) { results.classList.remove("on"); return; }
  results.classList.add("on");
  const nd = needle.toLowerCase(), hits = [];
  for (const n of M.dfs) if (blob(n).indexOf(nd) >= 0) hits.push(n);
  results.appendChild(el("div", "empty", hits.length ? hits.length + " match" + (hits.length === 1 ? "" : "es") +
                         (hits.length > 300 ? " (first 300 shown)" : "") : "no match for “" + needle + "”"));
  const frag = document.createDocumentFragment();
  for (const n of hits.slice(0, 300)) {
    const h = el("div", "hit");
    h.dataset.id = n.id;
    const head = el("div");
    head.appendChild(el("span", "kind k-" + kindCls(n.kind), n.kind === "subcall" ? "sub" : n.kind));
    head.appendChild(document.createTextNode(" " + firstLine(title(n), 90)));
    h.appendChild(head);
    const j = n.lc.indexOf(nd), a = Math.max(0, j - 50);
    const snip = el("div", "snip");
    snip.appendChild(marked((a > 0 ? "…" : "") + n.blob.slice(a, j + nd.length + 90).replace(/\s+/g, " "), needle));
    h.appendChild(snip);
    frag.appendChild(h);
  }
  results.appendChild(frag);
}
searchBox.addEventListener("input", function () {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(runSearch, 120);
});
searchBox.addEventListener("keydown", function (e) {
  if (e.key === "Escape") { searchBox.value = ""; runSearch(); }
  if (e.key === "Enter") { clearTimeout(searchTimer); runSearch(); const h = results.querySelector(".hit"); if (h) h.click(); }
});
results.addEventListener("click", function (e) {
  const h = e.target.closest(".hit");
  if (h) select(h.dataset.id, needle, true);
});
document.addEventListener("keydown", function (e) {
  if (e.key === "/" && document.activeElement !== searchBox) { e.preventDefault(); searchBox.focus(); }
});

// ------------------------------------------------------------------ render all
function renderAll() {
  finalize();
  tlRows = null;
  if (scope) scope = M.nodes.get(scope.id) || null;
  if (M.root && !expanded.size) expanded.add(M.root.id);
  renderSummary(); renderTree(); renderAxis(); renderTimeline();
  if (selected && M.nodes.has(selected)) renderDetail(M.nodes.get(selected), needle);
  else if (M.root) select(M.root.id, null, false);
  if (needle) runSearch();
}

const data = JSON.parse(document.getElementById("recursa-data").textContent);
for (const ev of data) ingest(ev);
renderAll();
window.__recursa = {renderMs: performance.now(), events: M.nEvents, model: M};

// ------------------------------------------------------------------ live
if (CFG.live) {
  const liveEl = document.getElementById("live");
  let offset = CFG.offset || 0, busy = false;
  async function poll() {
    if (busy) return;
    busy = true;
    try {
      const sep = CFG.events_url.includes("?") ? "&" : "?";
      const r = await fetch(CFG.events_url + sep + "offset=" + offset, {cache: "no-store"});
      const j = await r.json();
      if (j.offset < offset) { reset(null); expanded.clear(); pages.clear(); selected = null; }
      offset = j.offset;
      if (j.events.length) { for (const ev of j.events) ingest(ev); renderAll(); }
      const done = M.root && M.root.end !== null;
      liveEl.textContent = (done ? "run finished" : "live") + " · " + CFG.source + " · " +
        new Date().toLocaleTimeString();
    } catch (err) {
      liveEl.textContent = "live · server not reachable (" + err + ")";
    } finally { busy = false; }
  }
  poll();
  setInterval(poll, CFG.poll_ms || 1000);
}
})();
"""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<header>
  <div class="top">
    <h1>recursa</h1><span id="runid"></span><span id="status" class="badge">…</span>
    <span id="srcbadge" class="badge" style="display:none" title="the answer's sources"></span>
    <span id="live"></span>
    <input id="search" type="search" placeholder="Search the run  ( / )" autocomplete="off">
  </div>
  <div id="query"></div>
  <div id="totals"></div>
  <div id="answer" title="click to expand"></div>
</header>
<main>
  <section id="left">
    <div id="results"></div>
    <div id="tree"></div>
  </section>
  <section id="detail"></section>
</main>
<section id="tl">
  <div id="tl-head"><b>timeline</b><span id="tl-info"></span>
    <button id="tl-all" class="more" style="display:none">whole run</button></div>
  <div id="tl-axis"></div>
  <div id="tl-body"><div id="tl-spacer"></div></div>
</section>
<script type="application/json" id="recursa-config">{config}</script>
<script type="application/json" id="recursa-data">{data}</script>
<script>{js}</script>
</body>
</html>
"""
