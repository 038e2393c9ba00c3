// fanin dashboard: polls dashboard/api/state every second and redraws. No dependencies.
"use strict";

const POLL_MS = 1000;
const palette = ["#4fb3ff", "#3ecf8e", "#f5b83d", "#c792ea", "#ff8f66", "#7fdbca", "#f78c6c", "#addb67", "#82aaff", "#ffcb6b"];
const jobColors = new Map();

function colorOf(job) {
  if (!jobColors.has(job)) {
    let h = 0;
    for (const c of job) h = (h * 31 + c.charCodeAt(0)) >>> 0;
    jobColors.set(job, palette[h % palette.length]);
  }
  return jobColors.get(job);
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function fixed(x, d) { return Number.isFinite(x) ? x.toFixed(d) : "–"; }

function clock(t) {
  const d = new Date(t);
  return d.toLocaleTimeString([], { hour12: false });
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  body.replaceChildren();
  if (!jobs.length) {
    body.append(el("tr", { class: "empty" }, el("td", { colspan: 11 }, "no jobs yet")));
    return;
  }
  for (const j of jobs) {
    const name = el("td", {}, el("span", { class: "swatch", style: "background:" + colorOf(j.id) }), j.id);
    body.append(el("tr", { "data-job": j.id, "data-state": j.state, "data-step": j.step },
      name,
      el("td", {}, el("span", { class: "badge " + j.state }, j.state)),
      el("td", { class: "num" }, j.step < 0 ? "–" : j.step),
      el("td", { class: "num", "data-rate": j.steps_per_sec }, fixed(j.steps_per_sec, 2)),
      el("td", { class: "num" }, j.ranks ?? "–"),
      el("td", { class: "num", "data-workers": (j.workers || []).length }, workerCount(j)),
      el("td", { class: "num" }, j.placed + " / " + j.shards),
      el("td", {}, j.function ? j.function + (j.sync ? " · " + j.sync : "") : "–"),
      el("td", { class: "num" }, j.bytes ? bytes(j.bytes) : "–"),
      el("td", { class: "num" }, j.pending),
      el("td", { class: "num" }, j.rejects)));
  }
}

// workerCount is a job's elastic workers as live / target ("all": every live worker holds ranks).
function workerCount(j) {
  const live = (j.workers || []).length;
  if (!live && !j.target_workers) return "–";
  return live + " / " + (j.target_workers || "all");
}

// rankList prints ranks with runs collapsed: 0-3, 6, 8-9.
function rankList(ranks) {
  if (!ranks || !ranks.length) return "–";
  const rs = [...ranks].sort((a, b) => a - b), out = [];
  for (let i = 0; i < rs.length;) {
    let j = i;
    while (j + 1 < rs.length && rs[j + 1] === rs[j] + 1) j++;
    out.push(j > i ? rs[i] + "-" + rs[j] : String(rs[i]));
    i = j + 1;
  }
  return out.join(", ");
}

// renderWorkers shows, per job with elastic workers, each worker and the ranks it holds.
function renderWorkers(jobs) {
  const box = document.getElementById("workers");
  box.replaceChildren();
  const elastic = jobs.filter(j => (j.workers || []).length || (j.unassigned || []).length || j.target_workers);
  if (!elastic.length) {
    box.append(el("p", { class: "empty" }, "no elastic workers"));
    return;
  }
  for (const j of elastic) {
    const ws = j.workers || [];
    const standby = ws.filter(w => w.standby).length;
    const head = el("div", { class: "head" },
      el("span", { class: "id" }, el("span", { class: "swatch", style: "background:" + colorOf(j.id) }), j.id),
      el("span", { class: "meta" }, `${ws.length} live · target ${j.target_workers || "all"}` +
        (standby ? ` · ${standby} standing by` : "") + ` · ${j.ranks} ranks · epoch ${j.epoch || 0}` +
        ((j.unassigned || []).length ? ` · unassigned ${rankList(j.unassigned)}` : "")));
    const table = el("table", {}, el("thead", {}, el("tr", {},
      el("th", {}, "worker"), el("th", {}, "host"), el("th", {}, "ranks"), el("th", { class: "num" }, "step"),
      el("th", { class: "num" }, "last beat"), el("th", {}, ""))));
    const body = el("tbody");
    if (!ws.length) body.append(el("tr", { class: "empty" }, el("td", { colspan: 6 }, "no live worker")));
    for (const w of ws) {
      body.append(el("tr", { "data-worker": w.id, class: w.standby ? "standby" : "" },
        el("td", {}, w.id), el("td", {}, w.host || "–"), el("td", { "data-ranks": (w.ranks || []).join(",") }, rankList(w.ranks)),
        el("td", { class: "num" }, w.step), el("td", { class: "num" }, fixed(w.beat_age_ms / 1000, 1) + " s ago"),
        el("td", {}, w.standby ? el("span", { class: "badge waiting" }, "standby") : "")));
    }
    table.append(body);
    box.append(el("div", { class: "elastic", "data-job": j.id }, head, table));
  }
}

const series = [
  { key: "cores", label: "pool cores", color: "#4fb3ff", step: true },
  { key: "desired_cores", label: "desired", color: "#c792ea", step: true, dash: "5 4", decided: true },
  { key: "demand", label: "demand (cores at peak)", color: "#f5b83d", decided: true },
  { key: "busy", label: "busy cores (average)", color: "#3ecf8e" },
];

function renderChart(history) {
  const box = document.getElementById("chart");
  const W = Math.max(box.clientWidth, 300), H = 220, L = 36, R = 10, T = 10, B = 22;
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const mk = (tag, attrs) => {
    const e = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    svg.append(e);
    return e;
  };
  const now = history.length ? history[history.length - 1].t : Date.now();
  const t0 = Math.min(history.length ? history[0].t : now, now - 30000);
  let ymax = 1;
  for (const s of history) for (const k of series) ymax = Math.max(ymax, s[k.key] || 0);
  ymax = Math.ceil(ymax * 1.15);
  const x = t => L + (W - L - R) * (t - t0) / Math.max(1, now - t0);
  const y = v => H - B - (H - B - T) * v / ymax;
  for (let i = 0; i <= 4; i++) {
    const v = ymax * i / 4;
    mk("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "axis" });
    mk("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }).textContent = Number.isInteger(v) ? v : v.toFixed(1);
  }
  mk("text", { x: L, y: H - 4 }).textContent = clock(t0);
  mk("text", { x: W - R, y: H - 4, "text-anchor": "end" }).textContent = clock(now);
  for (const k of series) {
    let d = "";
    let started = false;
    for (const s of history) {
      if (k.decided && !s.desired) continue; // no decision yet: nothing to draw
      const px = x(s.t), py = y(s[k.key] || 0);
      if (!started) d += `M${px},${py}`;
      else d += k.step ? `H${px}V${py}` : `L${px},${py}`;
      started = true;
    }
    if (d) mk("path", { d, fill: "none", stroke: k.color, "stroke-width": 2, "stroke-dasharray": k.dash || "", "data-series": k.key });
  }
  box.replaceChildren(svg);
  const legend = document.getElementById("legend");
  const last = history[history.length - 1] || {};
  legend.replaceChildren(...series.map(k => el("span", {},
    el("span", { class: "swatch", style: "background:" + k.color }),
    `${k.label}: ${last[k.key] === undefined ? "–" : fixed(last[k.key], k.step ? 0 : 2)}`)),
    el("span", {}, `runtimes: ${last.runtimes ?? "–"} live, ${last.desired || "–"} desired`));
}

function renderPlacement(runtimes) {
  const box = document.getElementById("placement");
  box.replaceChildren();
  if (!runtimes.length) {
    box.append(el("p", { class: "empty" }, "no runtimes yet"));
    return;
  }
  for (const r of runtimes) {
    const cls = "runtime" + (r.alive ? "" : " dead") + (r.draining ? " draining" : "");
    const load = r.cores ? Math.min(100, 100 * r.busy / r.cores) : 0;
    const chips = el("div", { class: "chips" });
    for (const s of r.shards) {
      chips.append(el("span", {
        class: "chip", style: "background:" + colorOf(s.job), "data-shard": s.key,
        title: `${s.key} · epoch ${s.epoch} · step ${s.step} · pending ${s.pending}`,
      }, `${s.job}/${s.shard}`));
    }
    const state = r.alive ? (r.draining ? "draining" : `${r.cores} cores · up ${r.uptime}`) : "gone";
    box.append(el("div", { class: cls, "data-runtime": r.id },
      el("div", { class: "head" }, el("span", { class: "id" }, r.id), el("span", { class: "meta" }, state)),
      el("div", { class: "bar", title: `busy ${fixed(r.busy, 2)} cores` }, el("span", { style: `width:${load}%` })),
      el("div", { class: "meta" }, `${r.shards.length} shards · busy ${fixed(r.busy, 2)} cores`),
      chips));
  }
}

function renderDecisions(decisions) {
  const list = document.getElementById("decisions");
  list.replaceChildren();
  if (!decisions.length) {
    list.append(el("li", { class: "empty" }, "no decision yet"));
    return;
  }
  for (const d of decisions) {
    const moves = d.moves || [];
    const what = `pool ${d.desired} · ${d.mode} · demand ${fixed(d.demand, 2)} cores` +
      (moves.length ? ` · ${moves.length} move${moves.length > 1 ? "s" : ""}` : "") +
      ((d.drain || []).length ? ` · drain ${d.drain.join(", ")}` : "");
    const why = el("ul");
    for (const r of d.reasons || []) why.append(el("li", {}, r));
    for (const m of moves.slice(0, 8)) why.append(el("li", {}, `${m.shard}: ${m.from || "unplaced"} → ${m.to} (${m.reason})`));
    if (moves.length > 8) why.append(el("li", {}, `… ${moves.length - 8} more moves`));
    list.append(el("li", {},
      el("span", { class: "when" }, clock(d.at)),
      el("span", { class: "what mode-" + d.mode }, what), why));
  }
}

function renderRejects(counts, recent) {
  const body = document.querySelector("#reject-counts tbody");
  body.replaceChildren();
  if (!counts.length) body.append(el("tr", { class: "empty" }, el("td", { colspan: 3 }, "none")));
  for (const c of counts) {
    body.append(el("tr", {}, el("td", {}, c.job), el("td", {}, c.reason), el("td", { class: "num" }, c.count)));
  }
  const list = document.getElementById("rejects");
  list.replaceChildren();
  for (const r of recent.slice(0, 30)) {
    list.append(el("li", {},
      el("span", { class: "when" }, clock(r.at)),
      el("span", { class: "reason" }, r.reason),
      `${r.job} shard ${r.shard} step ${r.step ?? "?"} rank ${r.rank}`,
      el("span", { class: "detail" }, r.detail)));
  }
}

// An API token given once as /#token=<token> is kept for the tab's life (not in the URL, not sent
// anywhere but to this gateway): the state then shows the jobs the token reaches, in full.
function authHeaders() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (m) {
    sessionStorage.setItem("fanin-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const tok = sessionStorage.getItem("fanin-token");
  return tok ? { Authorization: "Bearer " + tok } : {};
}

async function poll() {
  const conn = document.getElementById("conn");
  try {
    const res = await fetch("dashboard/api/state", { cache: "no-store", headers: authHeaders() });
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    const st = await res.json();
    renderJobs(st.jobs || []);
    renderWorkers(st.jobs || []);
    renderChart(st.history || []);
    renderPlacement(st.runtimes || []);
    renderDecisions(st.decisions || []);
    renderRejects(st.reject_counts || [], st.rejects || []);
    conn.dataset.state = st.connected ? "live" : "down";
    conn.textContent = (st.connected ? "live · " : "NATS disconnected · ") + clock(st.now) +
      (st.anonymous ? " · public view (open /#token=<API token> for your jobs' details)" : "");
  } catch (e) {
    conn.dataset.state = "down";
    conn.textContent = "unreachable: " + e.message;
  }
  setTimeout(poll, POLL_MS);
}

poll();
