// atoll dashboard: every text from the server is set as text (textContent), never as HTML:
// job names, reasons and logs are other people's.
"use strict";

const $ = (id) => document.getElementById(id);
let csrf = "";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function ago(ts) {
  const s = Math.max(0, Math.round(Date.now() / 1000 - ts));
  if (s < 120) return `${s}s ago`;
  return s < 7200 ? `${Math.floor(s / 60)}m ago` : `${Math.floor(s / 3600)}h ago`;
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 120) return `${s}s`;
  return s < 7200 ? `${Math.floor(s / 60)}m ${s % 60}s` : `${(s / 3600).toFixed(1)}h`;
}

function showError(text) {
  const node = $("error");
  node.textContent = text || "";
  node.hidden = !text;
}

// The link to the server, as the dashboard's events say it.
function linkState(kind, text) {
  const node = $("link");
  node.className = "link " + kind;
  node.textContent = text;
}

async function getJSON(url) {
  const answer = await fetch(url, { credentials: "same-origin" });
  const body = await answer.json().catch(() => ({ error: `HTTP ${answer.status}` }));
  if (!answer.ok) throw new Error(body.error || `HTTP ${answer.status}`);
  return body;
}

async function whoami() {
  try {
    const me = await getJSON("/api/me");
    csrf = me.csrf;
    $("who").textContent = `${me.user} (${me.role}) · study ${me.study}`;
  } catch (err) {
    showError(err.message);
  }
}

// One EventSource; it says reconnected after the server (or this link) came back, and when
// the dashboard itself stopped.
function follow(url, onEvent) {
  const source = new EventSource(url);
  let lost = false;
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "disconnected") {
      lost = true;
      linkState("down", "server unreachable: reconnecting…");
    } else if (event.type === "stopped") {
      source.close(); // its dashboard process is gone: a reload needs a new `atoll dashboard`
      linkState("down", "the dashboard stopped (Ctrl-C): start `atoll dashboard` again");
    } else if (event.type === "reconnected") {
      lost = false;
      linkState("live", "reconnected to the server · live");
    } else {
      if (!lost && !$("link").textContent.startsWith("reconnected")) linkState("live", "live");
      onEvent(event, source);
    }
  };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) return;
    lost = true;
    linkState("down", "dashboard unreachable: reconnecting…");
  };
  return source;
}

// -- the overview ------------------------------------------------------------------------------
function capacityText(capacity) {
  if (!capacity) return "–";
  const set = Object.entries(capacity).filter(([, v]) => v !== null && v !== undefined);
  if (!set.length) return "not limited";
  return set.map(([k, v]) => `${k} ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
}

function renderSites(answer) {
  fill($("sites").tBodies[0], answer.sites.map((s) => {
    const state = el("td", s.online ? "online" : "offline", s.online ? "online" : "offline");
    const ours = s.study_jobs || [];
    const others = s.other_study_jobs || 0;
    const held = el("td");
    for (const id of ours) {
      const a = el("a", id.slice(0, 8));
      a.href = `/jobs/${encodeURIComponent(id)}`;
      held.appendChild(a);
      held.appendChild(document.createTextNode(" "));
    }
    if (others) held.appendChild(document.createTextNode(`${others} of other studies`));
    if (!ours.length && !others) held.textContent = s.online ? "free" : "–";
    const beat = s.heartbeat_s_ago === undefined ? "–" : `${s.heartbeat_s_ago.toFixed(0)}s ago`;
    const tr = row([s.name, state, s.launcher || "–", capacityText(s.capacity), held, s.version || "–", beat]);
    tr.dataset.site = s.name;
    return tr;
  }));
}

function renderJobs(answer) {
  const page = answer.page, total = answer.total || 0, size = answer.page_size;
  fill($("jobs").tBodies[0], answer.jobs.map((j) => {
    const id = el("td");
    const a = el("a", j.job_id);
    a.href = `/jobs/${encodeURIComponent(j.job_id)}`;
    id.appendChild(a);
    let waits = "";
    if (j.state === "SUBMITTED") {
      waits = (j.queue_position ? `#${j.queue_position} in the queue` : "queued") + (j.reason ? ` · ${j.reason}` : "");
    } else if (j.state.startsWith("FINISHED") && j.reason) {
      waits = j.reason;
    }
    const took = j.state.startsWith("FINISHED") ? duration(j.updated - j.created) : `${duration(Date.now() / 1000 - j.created)} so far`;
    const tr = row([id, j.name, el("td", j.state, "state"), waits, j.submitter, ago(j.created), took]);
    tr.dataset.job = j.job_id;
    return tr;
  }));
  $("total").textContent = `${total} in all`;
  $("pageinfo").textContent = total ? `${page * size + 1}–${Math.min(total, (page + 1) * size)} of ${total}` : "no jobs";
  $("prev").hidden = page === 0;
  $("next").hidden = (page + 1) * size >= total;
  $("prev").href = `/?page=${page - 1}`;
  $("next").href = `/?page=${page + 1}`;
}

function overview() {
  const page = Number(new URLSearchParams(location.search).get("page") || 0);
  follow(`/api/overview/stream?page=${page}`, (event) => {
    if (event.type === "error") showError(event.message);
    if (event.type !== "overview") return;
    showError("");
    renderSites(event.sites);
    renderJobs(event.jobs);
    if (!performance.getEntriesByName("atoll:first-render").length) performance.mark("atoll:first-render");
  });
}

// -- a job -------------------------------------------------------------------------------------
const job = { id: "", status: null, history: [], events: [], seen: new Set(), charts: {}, logs: {} };

function eventKey(e) {
  return `${e.at}|${e.source}|${JSON.stringify(e)}`;
}

// Plotly reads a subset of HTML in titles and names (links among them): metric and site names
// are the job's, so they go in as entities, shown as they are written.
function plain(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// Each series: chart title -> series name -> [[x, y]...]
function seriesOf(events) {
  const charts = {};
  const add = (chart, name, x, y) => {
    if (typeof y !== "number" || !isFinite(y)) return;
    ((charts[chart] ||= {})[name] ||= []).push([x, y]);
  };
  const steps = {};
  for (const e of events) {
    if (e.source === "server" && e.event === "round" && typeof e.round === "number") {
      const r = e.round;
      const g = e.global || {};
      for (const [k, v] of Object.entries(g.train || {})) add(`train ${k}`, "global", r, v);
      for (const [k, v] of Object.entries(g.validate || {})) add(`validate ${k}`, "global", r, v);
      if (!e.global) for (const [k, v] of Object.entries(e.metrics || {})) add(k, "global", r, v);
      for (const [site, m] of Object.entries(e.sites || {})) {
        for (const [k, v] of Object.entries((m && m.train) || {})) add(`train ${k}`, site, r, v);
        for (const [k, v] of Object.entries((m && m.validate) || {})) add(`validate ${k}`, site, r, v);
      }
      if (e.privacy) add("DP ε", "global", r, e.privacy.epsilon);
    } else if (e.source !== "server" && e.metrics) {
      // a site's fl.log_metrics: one point per call, by its step where it gave one
      const n = (steps[e.source] = (steps[e.source] || 0) + 1);
      const x = typeof e.step === "number" ? e.step : n;
      for (const [k, v] of Object.entries(e.metrics)) add(`${k} (site log)`, e.source, x, v);
    }
  }
  return charts;
}

function drawCharts() {
  if (typeof Plotly === "undefined") return;
  const charts = seriesOf(job.events);
  let drawn = 0;
  $("nocharts").hidden = Object.keys(charts).length > 0;
  for (const [title, series] of Object.entries(charts).sort()) {
    let div = job.charts[title];
    if (!div) {
      div = job.charts[title] = el("div", null, "chart");
      div.dataset.chart = title;
      $("charts").appendChild(div);
    }
    const traces = Object.entries(series).map(([name, points]) => ({
      name: plain(name), x: points.map((p) => p[0]), y: points.map((p) => p[1]), mode: "lines+markers", type: "scatter",
    }));
    div.dataset.points = String(traces.reduce((n, t) => n + t.x.length, 0));
    drawn += traces.reduce((n, t) => n + t.x.length, 0);
    Plotly.react(div, traces, {
      title: { text: plain(title) }, margin: { l: 48, r: 16, t: 40, b: 36 }, xaxis: { title: { text: "round" } },
    }, { displaylogo: false, displayModeBar: false, responsive: true });
  }
  window.atollDrawn.push(drawn);
}

function drawTables() {
  const dp = job.events.filter((e) => e.event === "round" && e.privacy);
  $("dpsec").hidden = dp.length === 0;
  fill($("dp").tBodies[0], dp.map((e) => row([e.round, Number(e.privacy.epsilon).toFixed(3), e.privacy.delta])));
  const xs = job.events.filter((e) => e.event === "cross_site_eval" && e.table);
  $("xsec").hidden = xs.length === 0;
  if (xs.length) {
    const last = xs[xs.length - 1], key = last.key_metric;
    $("xkey").textContent = key ? `(${key})` : "";
    const sites = [...new Set(Object.values(last.table).flatMap((r) => Object.keys(r)))].sort();
    fill($("xsite").tHead, [row(["model", ...sites].map((t) => el("th", t)))]);
    fill($("xsite").tBodies[0], Object.entries(last.table).map(([model, r]) => row([model, ...sites.map((s) => {
      const m = r[s];
      const v = m && (key in m ? m[key] : Object.values(m)[0]);
      return typeof v === "number" ? v.toFixed(4) : "–";
    })])));
  }
  const rounds = job.events.filter((e) => e.source === "server" && typeof e.round === "number");
  if (rounds.length) {
    const last = rounds[rounds.length - 1];
    $("round").textContent = String(last.round);
    // a round's report names the total; the checkpoint after it (a server event too) does not
    const named = rounds.filter((e) => e.total_rounds || e.num_rounds);
    const total = named.length ? (named[named.length - 1].total_rounds || named[named.length - 1].num_rounds) : 0;
    $("rounds").textContent = total ? `of ${total}` : "";
  }
}

// When each round event reached the page (read by bench/dashboard.py: round end to page).
window.atollSeen = [];
// How many points the charts held after each drawing (read by the browser tests).
window.atollDrawn = [];

function addEvents(events, live) {
  let added = false;
  for (const e of events || []) {
    const key = eventKey(e);
    if (job.seen.has(key)) continue;
    job.seen.add(key);
    if (live && e.event === "round") window.atollSeen.push({ round: e.round, at: e.at, seen: Date.now() / 1000 });
    job.events.push(e);
    added = true;
  }
  if (added) {
    job.events.sort((a, b) => (a.at || 0) - (b.at || 0));
    drawTables();
    drawCharts();
  }
}

function renderStatus(s) {
  $("job").hidden = false;
  document.title = `atoll · ${s.name}`;
  $("name").textContent = s.name;
  $("state").textContent = s.state;
  $("jobid").textContent = s.job_id;
  $("submitter").textContent = s.submitter;
  const end = s.state.startsWith("FINISHED");
  $("when").textContent = `${ago(s.created)}` + (end ? ` · took ${duration(s.updated - s.created)}` : "");
  $("reason").textContent = s.reason || "";
  $("reason").hidden = !s.reason;
  $("abort").hidden = end;
  $("results").hidden = !end;
  $("provbtn").hidden = !end;
  job.status = s;
  renderParts();
}

// A time the server recorded (seconds since the epoch), in the browser's time zone.
function clock(at) {
  const when = new Date(at * 1000);
  return when.toDateString() === new Date().toDateString() ? when.toLocaleTimeString() : when.toLocaleString();
}

// Each part's state changes as the server kept them, whenever the page was opened.
function renderHistory(history) {
  if (!Array.isArray(history)) return;
  job.history = history;
  fill($("timeline").tBodies[0], history.map((h) => {
    const tr = row([clock(h.at), h.part, el("td", h.state, "state"), h.reason || ""]);
    tr.dataset.part = h.part;
    tr.dataset.state = h.state;
    tr.dataset.at = String(h.at);
    return tr;
  }));
  renderParts();
}

function renderParts() {
  const parts = (job.status && job.status.parts) || {};
  const since = {};
  for (const h of job.history) since[h.part] = h.at; // in time order: the last change wins
  const names = Object.keys(parts).sort((a, b) => (a !== "server") - (b !== "server") || a.localeCompare(b));
  fill($("parts").tBodies[0], names.map((n) => {
    const tr = row([n, el("td", parts[n].state, "state"), parts[n].reason || "", n in since ? clock(since[n]) : "–"]);
    tr.dataset.part = n;
    return tr;
  }));
}

function addLogs(logs, replace) {
  for (const [name, text] of Object.entries(logs || {})) {
    let pre = job.logs[name];
    if (!pre) {
      const box = el("details");
      box.open = true;
      box.appendChild(el("summary", name));
      pre = job.logs[name] = el("pre");
      pre.dataset.log = name;
      box.appendChild(pre);
      $("logs").appendChild(box);
    }
    const follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (replace) pre.textContent = text;
    else pre.appendChild(document.createTextNode(text));
    if (follow) pre.scrollTop = pre.scrollHeight;
  }
}

async function abortJob() {
  if (!window.confirm(`Abort job ${job.id}? Every worker of it is stopped.`)) return;
  const answer = await fetch(`/api/jobs/${encodeURIComponent(job.id)}/abort`, {
    method: "POST", credentials: "same-origin", headers: { "x-atoll-csrf": csrf },
  });
  const body = await answer.json().catch(() => ({}));
  const msg = $("abortmsg");
  msg.hidden = answer.ok;
  msg.textContent = answer.ok ? "" : `abort refused: ${body.error || answer.status}`;
  // the job's change comes with the page's stream: the answer's status (the job as it was at
  // the abort) is not drawn, as it may come after the stream has shown the job's end
}

async function showProvenance() {
  try {
    const record = await getJSON(`/api/jobs/${encodeURIComponent(job.id)}/provenance`);
    $("prov").textContent = JSON.stringify(record, null, 2);
  } catch (err) {
    $("prov").textContent = err.message;
  }
  $("provsec").hidden = false;
}

async function jobPage() {
  job.id = decodeURIComponent(location.pathname.split("/")[2] || "");
  $("abort").addEventListener("click", abortJob);
  $("provbtn").addEventListener("click", showProvenance);
  $("results").href = `/api/jobs/${encodeURIComponent(job.id)}/results`;
  try {
    const first = await getJSON(`/api/jobs/${encodeURIComponent(job.id)}`);
    renderStatus(first.status);
    renderHistory(first.part_history);
    addEvents(first.events, false);
    addLogs(first.logs, true);
    performance.mark("atoll:first-render");
  } catch (err) {
    showError(err.message);
    linkState("", "");
    return;
  }
  follow(`/api/jobs/${encodeURIComponent(job.id)}/stream`, (event, source) => {
    if (event.type === "job") {
      renderStatus(event.status);
      renderHistory(event.history);
      addEvents(event.events, true);
      addLogs(event.logs, Boolean(event.first));
    } else if (event.type === "error") {
      showError(event.message);
      if (!event.retry) source.close();
    } else if (event.type === "end") {
      source.close();
      linkState("", `finished: ${event.state}`);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  whoami();
  if (document.body.dataset.page === "job") jobPage();
  else overview();
});
