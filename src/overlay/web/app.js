// The live page of an overlay cluster (SPEC §14).  No build step, no library:
// one EventSource on /events delivers the whole-cluster view (see
// overlay/net/admin.py, AdminServer.cluster_view) about once a second, and
// render() updates the page in place so bars and colours animate.
"use strict";

const PALETTE = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2", "#dc2626", "#65a30d", "#4b5563", "#c026d3"];
const KNOWN_STATES = ["UNDERLOADED", "STABLE", "OVERLOADED", "BUSY", "UNKNOWN"];
const CHART_WINDOW = 300; // at most this many seconds of S/dc̄ shown
const CHART_MIN_WINDOW = 30; // and at least this many, so a young cluster fills the chart
const FEED_KEEP = 60;

const $ = (sel) => document.querySelector(sel);
const ownerColour = (n) => PALETTE[((n % PALETTE.length) + PALETTE.length) % PALETTE.length];

let last = null; // the previous snapshot, for rates
const feedKeys = new Set();

function fmt(x, digits = 2) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en-US");
  if (Number.isInteger(x)) return String(x);
  return x.toFixed(digits);
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

function svgEl(tag, attrs = {}) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function stateClass(state) {
  return KNOWN_STATES.includes(state) ? state : "other";
}

function clock(t) {
  const d = new Date(t * 1000);
  return d.toTimeString().slice(0, 8) + "." + String(Math.floor(d.getMilliseconds() / 100));
}

// -- header and totals --------------------------------------------------------------------

function renderTotals(s) {
  $("#cluster-name").textContent = s.cluster;
  $("#served-by").textContent = s.served_by;
  $("#updated").textContent = "updated " + clock(s.time);
  $("#spread-ratio").textContent = fmt(s.spread_ratio, 3);
  $("#mean-dc").textContent = fmt(s.mean_dc, 1);
  const t = s.totals;
  $("#events-in").textContent = fmt(t.events_in);
  $("#events-notified").textContent = fmt(t.notifications_out);
  $("#migrations").textContent = fmt(t.migrations);
  $("#moved").textContent = `${fmt(t.subscriptions_moved)} subscriptions, ${fmt(t.migration_bytes)} bytes moved`;
  $("#splits").textContent = `${fmt(t.splits)} · ${fmt(t.merges)} · ${fmt(t.replications)}`;
  $("#aborts").textContent = `${fmt(t.migrations_aborted)} aborted, ${fmt(t.reforwards)} reforwards`;
  if (last && s.time > last.time) {
    const dt = s.time - last.time;
    $("#events-rate").textContent = fmt((t.events_in - last.totals.events_in) / dt, 0) + " /s";
    $("#notified-rate").textContent = fmt((t.notifications_out - last.totals.notifications_out) / dt, 0) + " /s";
  }
}

// -- nodes ---------------------------------------------------------------------------------

function renderNodes(s) {
  const box = $("#nodes");
  const mean = s.mean_dc || 0;
  const levels = s.nodes.map((n) => n.dc || 0);
  const top = Math.max(1e-9, ...levels, mean * (1 + s.delta)) * 1.1;
  const seen = new Set();
  for (const n of s.nodes) {
    const id = String(n.node);
    seen.add(id);
    let row = box.querySelector(`.node[data-node="${id}"]`);
    if (!row) {
      row = el("div", { class: "node", "data-node": id },
        el("div", { class: "name" }, el("span", { class: "swatch" }), `node ${id}`, el("span", { class: "badge" })),
        el("div", { class: "bar" }, el("div", { class: "fill" }), el("div", { class: "band" })),
        el("div", { class: "nums" }),
        el("div", { class: "why" }));
      row.querySelector(".swatch").style.background = ownerColour(n.node);
      // Keep rows ordered by node id, so a node that joins lands in its place.
      const after = [...box.children].find((r) => Number(r.dataset.node) > n.node);
      box.insertBefore(row, after || null);
    }
    const state = n.state || "UNKNOWN";
    row.dataset.state = state;
    row.dataset.dc = n.dc === null || n.dc === undefined ? "" : String(n.dc);
    row.classList.toggle("unreachable", !n.reachable);
    const badge = row.querySelector(".badge");
    badge.className = "badge " + stateClass(state);
    badge.textContent = n.draining ? `${state} · DRAINING` : state;
    const fill = row.querySelector(".fill");
    fill.className = "fill " + stateClass(state);
    fill.style.width = (100 * Math.min(1, (n.dc || 0) / top)).toFixed(2) + "%";
    const band = row.querySelector(".band");
    band.style.left = (100 * (mean * (1 - s.delta)) / top).toFixed(2) + "%";
    band.style.width = (100 * (2 * s.delta * mean) / top).toFixed(2) + "%";
    const queued = n.reachable
      ? Object.values(n.links || {}).reduce((a, l) => a + l.high + l.normal, 0) + (n.inbox ? n.inbox.high + n.inbox.normal : 0)
      : null;
    const nums = row.querySelector(".nums");
    nums.innerHTML = "";
    nums.append(
      "dc ", el("b", { class: "dc", text: fmt(n.dc, 1) }),
      ` · ${n.reachable ? n.channels.length : "?"} ch · ${n.reachable ? fmt(n.subscriptions) : "?"} subs · ${fmt(queued)} queued`,
    );
    // The queue budget and the slow-consumer policy (overlay.net.clients rule 7).
    const c = n.reachable ? n.clients || {} : {};
    if (c.queue_budget) {
      const mib = (b) => fmt(b / 1048576, 1);
      nums.append(el("span", {
        class: "clients",
        title: "bytes queued for this node's clients, of its [limits] queue_budget; clients disconnected as slow consumers",
        text: ` · clients ${mib(c.queued_bytes)} of ${mib(c.queue_budget)} MiB · ${fmt(c.slow_consumer_disconnects || 0)} slow cut`,
      }));
    }
    row.querySelector(".why").textContent = n.reachable ? "" : `shown from its last LIEM: ${n.why || "admin endpoint unreachable"}`;
  }
  for (const row of [...box.children]) if (!seen.has(row.dataset.node)) row.remove();
}

// -- S/dc̄ chart ---------------------------------------------------------------------------

function renderChart(s) {
  const canvas = $("#chart");
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  $("#chart-note").textContent = `as node ${s.served_by} sees it, per slice; green lines: migrations`;
  const pad = { l: 36, r: 8, t: 8, b: 20 };
  const t1 = s.time;
  const first = s.history.length ? s.history[0][0] : t1;
  const win = Math.min(CHART_WINDOW, Math.max(CHART_MIN_WINDOW, Math.ceil((t1 - first) / 10) * 10));
  const t0 = t1 - win;
  const pts = s.history.filter((p) => p[0] >= t0);
  const ymax = Math.max(0.5, ...pts.map((p) => p[1])) * 1.1;
  const X = (t) => pad.l + ((t - t0) / win) * (w - pad.l - pad.r);
  const Y = (v) => h - pad.b - (v / ymax) * (h - pad.t - pad.b);
  ctx.font = "11px system-ui, sans-serif";
  ctx.strokeStyle = "#e5e7eb"; ctx.fillStyle = "#6b7280"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4, y = Y(v);
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
    ctx.fillText(v.toFixed(2), 2, y + 4);
  }
  const step = win <= 60 ? 10 : win <= 180 ? 30 : 60;
  for (let k = 0; k * step <= win; k++) {
    const ago = k * step, x = X(t1 - ago);
    const label = ago === 0 ? "now" : ago % 60 === 0 ? `-${ago / 60}m` : `-${ago}s`;
    ctx.fillText(label, Math.max(pad.l, x - (ago === 0 ? 18 : 12)), h - 5);
  }
  ctx.strokeStyle = "#10b981";
  for (const e of s.feed) {
    if ((e.kind === "migration" || e.kind === "replication") && e.time >= t0) {
      ctx.beginPath(); ctx.moveTo(X(e.time), pad.t); ctx.lineTo(X(e.time), h - pad.b); ctx.stroke();
    }
  }
  if (!pts.length) { ctx.fillText("waiting for the first slices…", pad.l + 8, pad.t + 14); return; }
  ctx.strokeStyle = "#111827"; ctx.lineWidth = 2; ctx.beginPath();
  pts.forEach((p, i) => (i ? ctx.lineTo(X(p[0]), Y(p[1])) : ctx.moveTo(X(p[0]), Y(p[1]))));
  ctx.stroke();
}

// -- channel placement ------------------------------------------------------------------------

function span(c, axis) {
  // The channel's extent on the first DA: its interval, or the whole axis for
  // a string attribute (its channels then share the strip, stacked).
  const k = c.constraints[0];
  if (k && k.kind === "range") return [k.lo, k.hi];
  return [axis.min, axis.max];
}

function renderPlacement(s) {
  const svg = $("#placement");
  const axis = s.da[0];
  const W = svg.clientWidth || 800, H = 120, top = 4, strip = 92;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.innerHTML = "";
  const lo = Number(axis.min), hi = Number(axis.max);
  const X = (v) => 4 + ((Number(v) - lo) / (hi - lo || 1)) * (W - 8);
  // Elementary pieces between every channel boundary; in each, the channels
  // covering it are stacked, so splits on later attributes show as layers.
  const chans = s.placement.map((c) => ({ c, sp: span(c, axis) }));
  const cuts = [...new Set(chans.flatMap((x) => x.sp.map(Number)))].sort((a, b) => a - b);
  const widest = new Map();
  for (let i = 0; i + 1 < cuts.length; i++) {
    const a = cuts[i], b = cuts[i + 1];
    const here = chans.filter((x) => Number(x.sp[0]) <= a && Number(x.sp[1]) >= b);
    here.forEach((x, j) => {
      const bandH = strip / here.length;
      const owners = x.c.owners.length ? x.c.owners : [-1];
      owners.forEach((o, k) => {
        const r = svgEl("rect", {
          x: X(a), y: top + j * bandH + (k * bandH) / owners.length,
          width: Math.max(1, X(b) - X(a)), height: bandH / owners.length,
          fill: ownerColour(o), "data-channel": x.c.id, "data-owner": String(o),
        });
        const tip = svgEl("title");
        tip.textContent = `${x.c.id} on node ${x.c.owners.join(", ")}\n${x.c.space}\nload ${fmt(x.c.last_load)} · ${fmt(x.c.subscriptions)} subscriptions`;
        r.append(tip);
        svg.append(r);
      });
      const wpx = X(b) - X(a);
      const best = widest.get(x.c.id);
      if (!best || wpx > best.w) widest.set(x.c.id, { w: wpx, x: X(a), y: top + j * bandH, h: bandH });
    });
  }
  for (const [id, r] of widest) {
    if (r.w < 28 || r.h < 12) continue;
    const t = svgEl("text", { x: r.x + 4, y: r.y + Math.min(r.h / 2 + 4, 16) });
    t.textContent = id;
    svg.append(t);
  }
  for (let i = 0; i <= 4; i++) {
    const v = lo + ((hi - lo) * i) / 4;
    const t = svgEl("text", { x: Math.min(W - 30, Math.max(2, X(v) - 10)), y: H - 6, class: "axis" });
    t.textContent = (hi - lo > 20 ? Math.round(v) : v.toFixed(1)).toLocaleString("en-US");
    svg.append(t);
  }
  $("#placement-note").textContent = `the event space along ${axis.name} (${axis.kind}), coloured by owner; ${s.placement.length} channels`;
  const legend = $("#legend");
  legend.innerHTML = "";
  for (const n of s.nodes) {
    const i = el("i"); i.style.background = ownerColour(n.node);
    const count = s.placement.filter((c) => c.owners.includes(n.node)).length;
    legend.append(el("span", { "data-node": String(n.node) }, i, `node ${n.node}: ${count} ch`));
  }
  const body = $("#channels tbody");
  body.innerHTML = "";
  const rows = [...s.placement].sort((a, b) => Number(span(a, axis)[0]) - Number(span(b, axis)[0]) || a.id.localeCompare(b.id));
  for (const c of rows) {
    const sw = el("span", { class: "badge" }); sw.style.background = ownerColour(c.owners[0]); sw.textContent = c.owners.join(",");
    body.append(el("tr", { "data-channel": c.id },
      el("td", { text: c.id }), el("td", {}, sw), el("td", { text: c.space }),
      el("td", { class: "num", text: fmt(c.last_load) }), el("td", { class: "num", text: fmt(c.subscriptions) })));
  }
}

// -- balancing feed --------------------------------------------------------------------------

function summary(e) {
  switch (e.kind) {
    case "decision":
      if (e.phase === "receivers") {
        const c = (e.candidates || []).map((x) => `${x.node} (rank1 ${fmt(x.rank1)})`).join(", ");
        return `dc ${fmt(e.dc, 1)} vs dc̄ ${fmt(e.mean, 1)}: receivers ${c || "none"}`;
      }
      if (e.phase === "channels") {
        const moving = (e.transfer || []).join(", ") || "nothing";
        return `to node ${e.receiver}: φ ${fmt(e.phi, 1)}, move ${moving}${e.split ? `, split ${e.split} at load ${fmt(e.split_load, 1)}` : ""}`;
      }
      return `${e.phase}${e.reason ? ": " + e.reason : ""}`;
    case "split":
      return `${e.parent} on ${e.attr} → ` + (e.children || []).map((c) => `${c.id} ${c.space}`).join(" | ");
    case "merge":
      return `${(e.parts || []).join(" + ")} → ${e.merged} ${e.space}`;
    case "migration":
    case "replication":
      return `${(e.channels || []).join(", ")} → node ${e.receiver}: ${fmt(e.subscriptions)} subscriptions, ${fmt(e.bytes)} bytes, ${fmt(1000 * e.duration, 1)} ms${e.forced ? " (forced)" : ""}`;
    case "replicate":
      return `replicate ${e.channel} to node ${e.receiver} (load ${fmt(e.load)})`;
    case "abort":
      return `session ${e.session} to node ${e.receiver}: ${e.reason}`;
    case "state":
      return `${e.old} → ${e.new}`;
    default:
      return JSON.stringify(e).slice(0, 160);
  }
}

function scoreTable(rows, cols) {
  const t = el("table");
  t.append(el("tr", {}, ...cols.map((c) => el("th", { class: c === cols[0] ? "" : "num", text: c }))));
  for (const r of rows) t.append(el("tr", {}, ...cols.map((c) => el("td", { class: c === cols[0] ? "" : "num", text: typeof r[c] === "number" ? fmt(r[c], 3) : String(r[c] ?? "–") }))));
  return t;
}

function feedItem(e) {
  const head = [el("span", { class: "t", text: clock(e.time) }), `node ${e.node} `, el("span", { class: "kind", text: e.kind === "decision" ? `decide` : e.kind }), " ", summary(e)];
  const li = el("li", { class: e.kind, "data-time": String(e.time) });
  const scores = e.kind === "decision" && ((e.candidates && e.candidates.length) || (e.channels && e.channels.length));
  if (!scores) { li.append(...head); return li; }
  const d = el("details", {}, el("summary", {}, ...head));
  if (e.candidates && e.candidates.length) d.append(scoreTable(e.candidates, ["node", "rank1", "f2", "f3", "rank_o", "rank_u", "dc"]));
  if (e.channels && e.channels.length) d.append(scoreTable(e.channels, ["id", "load", "subscriptions", "f1", "f3", "f4", "rank2"]));
  li.append(d);
  return li;
}

// An overloaded node with no underloaded peer decides again every slice; the
// page leaves those out (GET /balancing has them; the view asks with idle=0).
const idle = (e) => e.kind === "decision" && e.phase === "receivers" && !(e.candidates || []).length;

function renderFeed(s) {
  const list = $("#feed");
  for (const e of s.feed) {
    if (idle(e)) continue;
    const key = `${e.node}|${e.time}|${e.kind}|${e.phase || ""}|${e.session || ""}`;
    if (feedKeys.has(key)) continue;
    feedKeys.add(key);
    const li = feedItem(e);
    li.dataset.key = key;
    const after = [...list.children].find((x) => Number(x.dataset.time) < e.time);
    list.insertBefore(li, after || null);
  }
  while (list.children.length > FEED_KEEP) {
    feedKeys.delete(list.lastElementChild.dataset.key);
    list.lastElementChild.remove();
  }
}

// -- wiring ----------------------------------------------------------------------------------

// A cluster running without TLS says so on every page (SPEC §16; [tls] insecure = true).
function renderSecurity(s) {
  const plain = s.insecure_nodes || [];
  const box = $("#insecure");
  box.hidden = plain.length === 0;
  box.textContent = plain.length === 0 ? "" :
    `⚠ not encrypted: node${plain.length > 1 ? "s" : ""} ${plain.join(", ")} run${plain.length > 1 ? "" : "s"} ` +
    "with [tls] insecure = true — plain TCP, peers prove the cluster secret, clients nothing. " +
    "For a network you trust only.";
}

function render(s) {
  renderSecurity(s);
  renderTotals(s);
  renderNodes(s);
  renderChart(s);
  renderPlacement(s);
  renderFeed(s);
  last = s;
}

function connect() {
  const live = $("#live");
  const source = new EventSource("/events");
  source.addEventListener("open", () => { live.className = "live on"; live.textContent = "live"; });
  source.addEventListener("error", () => { live.className = "live off"; live.textContent = "reconnecting…"; });
  source.addEventListener("cluster", (ev) => render(JSON.parse(ev.data)));
}

connect();
