// The live page: every server-sent event is a whole snapshot {status, charts};
// the page only renders it. The server keeps the charts' history (the last
// hour), so a page opened now shows what happened before it.
"use strict";

const BUCKET_MS = 10000;  // the server's bucket (bus/views/charts.py BUCKET_MS)
const layoutBase = {margin: {t: 40, r: 20, b: 40, l: 90}, legend: {orientation: "h"}};
// Date axes: at most this many labels, and each zoom level's own format, so
// labels neither overlap nor repeat the date at every tick.
const dateAxis = {type: "date", nticks: 8, automargin: true, tickformatstops: [
  {dtickrange: [null, 999], value: "%H:%M:%S.%L"},
  {dtickrange: [999, 60000], value: "%H:%M:%S"},
  {dtickrange: [60000, 86400000], value: "%H:%M"},
  {dtickrange: [86400000, null], value: "%b %d"}]};

function text(id, value) { document.getElementById(id).textContent = value; }

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

// A cell is a value, or {href, text}: a link to the page of that thing.
function table(id, columns, rows) {
  const head = "<tr>" + columns.map((c) => `<th>${c}</th>`).join("") + "</tr>";
  const body = rows.map((r) => "<tr>" + r.map((v) => `<td>${cell(v)}</td>`).join("") + "</tr>");
  document.getElementById(id).innerHTML = head + (body.join("") || `<tr><td>none</td></tr>`);
}

function cell(value) {
  if (value !== null && typeof value === "object") {
    return `<a href="${escape(value.href)}">${escape(value.text)}</a>`;
  }
  return escape(value);
}

function page(kind, name) {
  return name === null || name === undefined ? null
    : {href: `/${kind}/${encodeURIComponent(name)}`, text: name};
}

function task(name) {
  return name === null || name === undefined ? null
    : {href: "/tasks/" + encodeURIComponent(name), text: name};
}

function escape(value) {
  const span = document.createElement("span");
  span.textContent = value === null || value === undefined ? "-" : String(value);
  return span.innerHTML;
}

function plot(id, title, traces, layout) {
  const empty = traces.every((t) => (t.x || t.ids || []).length === 0);
  const note = empty ? [{text: "no data yet", showarrow: false, xref: "paper", yref: "paper",
                         x: 0.5, y: 0.5}] : [];
  Plotly.react(id, traces, {...layoutBase, title: {text: title}, annotations: note, ...layout},
               {displayModeBar: false, responsive: true});
}

function renderCounts(s) {
  text("path", s.file.path);
  text("messages", s.log.messages);
  text("last-seq", s.log.last_seq);
  text("agents-alive", s.agents_by_state.alive);
  text("claims-held", s.claims.held);
  text("tasks", s.tasks.ready + " / " + s.tasks.blocked + " / " + s.tasks.held);
  text("workers", Object.values(s.workers).reduce((a, b) => a + b, 0));
  text("reservations-live", s.reservations.length);
  text("pump-in-flight", s.pump.in_flight);
  text("export-lag", s.export.lag);
  text("file-size", bytes(s.file.size_bytes) + " / " + bytes(s.file.wal_bytes));
  document.body.dataset.lastSeq = s.log.last_seq;
}

function renderTables(s) {
  table("consumers", ["consumer", "kind", "cursor", "pending", "lag"],
        s.consumers.map((c) => [c.kind === "agent" ? page("agents", c.agent) : c.agent, c.kind,
                                c.cursor, c.pending, c.lag]));
  table("agents", ["agent", "state", "silent s", "status", "task"],
        s.agents.map((a) => [page("agents", a.agent), a.state, a.age_s.toFixed(1), a.status,
                             task(a.task)]));
  table("claims", ["task", "holder", "fence", "lease left s", "attempt"],
        s.claims.claims.map((c) => [task(c.task_id), page("agents", c.agent), c.fence,
                                    ((c.lease_until_ms - s.now_ms) / 1000).toFixed(1),
                                    c.attempts + "/" + c.max_attempts]));
  table("channels", ["channel", "type", "open", "awaiting ack", "dead letters"],
        s.channels.map((c) => [page("channels", c.name), c.type, c.open_deliveries,
                               c.awaiting_ack, c.dead_letters]));
  table("reservations", ["pattern", "holder", "mode", "expires", "reason"],
        s.reservations.map((r) => [r.pattern, page("agents", r.agent), r.mode,
                                   new Date(r.expires_at_ms).toISOString(), r.reason]));
}

// Plotly reads a date axis' range as strings in the page's own time zone, as its
// dates are drawn: the window in local time, without the zone.
function localIso(ms) {
  const at = new Date(ms);
  return new Date(ms - at.getTimezoneOffset() * 60000).toISOString().slice(0, 23).replace("T", " ");
}

function hourAxis(windowMs) {
  return {...dateAxis, autorange: false, range: windowMs.map(localIso)};
}

function renderRate(rate, windowMs) {
  const traces = Object.entries(rate).map(([type, series]) => ({
    name: type, type: "bar", x: series.t.map((t) => new Date(t + BUCKET_MS / 2)), y: series.n,
    width: BUCKET_MS}));
  plot("chart-rate", "messages per 10 s by type, last hour", traces,
       {barmode: "stack", bargap: 0, xaxis: hourAxis(windowMs)});
}

function renderLag(lag, windowMs) {
  const traces = Object.entries(lag).map(([name, s]) => ({
    name, type: "scatter", mode: "lines+markers", x: s.t.map((t) => new Date(t)), y: s.lag}));
  plot("chart-lag", "consumer lag (messages behind), last hour", traces,
       {xaxis: hourAxis(windowMs)});
}

// A worker's lane: one bar per state until the next; a terminal state
// (COMPLETED, CANCELLED, FAILED) is a marker where the lane stops.
function renderSwimlane(segments) {
  const byState = {};
  const ends = {name: "ended", type: "scatter", mode: "markers", x: [], y: [], text: [],
                hoverinfo: "text+x", marker: {symbol: "line-ns-open", size: 14, color: "#222"}};
  for (const seg of segments) {
    if (seg.terminal) {
      ends.x.push(new Date(seg.start_ms));
      ends.y.push(seg.worker);
      ends.text.push(seg.state);
      continue;
    }
    const t = byState[seg.state] || (byState[seg.state] = {
      name: seg.state, type: "bar", orientation: "h", x: [], y: [], base: []});
    t.x.push(Math.max(seg.end_ms - seg.start_ms, 1));
    t.y.push(seg.worker);
    t.base.push(new Date(seg.start_ms).toISOString());
  }
  const workers = new Set(segments.map((s) => s.worker)).size;
  plot("chart-swimlane", "worker states over time", [...Object.values(byState), ends],
       {barmode: "overlay", xaxis: dateAxis,
        yaxis: {automargin: true, type: "category"}, height: Math.max(320, 24 * workers + 120)});
}

function renderClaims(claims) {
  const agents = Object.keys(claims);
  plot("chart-claims", "claims held now, and takeovers in the last hour, by holder", [
    {name: "held", type: "bar", x: agents, y: agents.map((a) => claims[a].held)},
    {name: "takeovers (task_reclaimed)", type: "bar", x: agents,
     y: agents.map((a) => claims[a].taken_over)},
  ], {barmode: "group"});
}

function renderThreads(threads) {
  plot("chart-threads", "pump conversations (call trees)", [{
    type: "sunburst", ids: threads.ids, parents: threads.parents, labels: threads.labels,
    branchvalues: "remainder", maxdepth: 3, insidetextorientation: "horizontal",
    textfont: {size: 12}}], {margin: {t: 40, r: 10, b: 10, l: 10}});
}

// Counts and tables first, at once; the charts after the browser has painted
// them (Plotly takes a while), and only for the newest snapshot if several came.
// The charts are drawn at most every CHARTS_EVERY_MS: their points are ten-second
// buckets, and redrawing five charts at each commit would take the writers' CPU.
const CHARTS_EVERY_MS = 2000;
let chartsDue = null;
let chartsDrawnAt = -Infinity;

function render(snapshot) {
  const s = snapshot.status;
  renderCounts(s);
  renderTables(s);
  const live = document.getElementById("live");
  live.textContent = "live, as of " + new Date(s.now_ms).toISOString();
  live.className = "";
  if (chartsDue === null) {
    const wait = Math.max(0, chartsDrawnAt + CHARTS_EVERY_MS - performance.now());
    setTimeout(() => renderCharts(chartsDue), wait);
  }
  chartsDue = snapshot;
}

function renderCharts(snapshot) {
  chartsDue = null;
  chartsDrawnAt = performance.now();
  renderRate(snapshot.charts.rate, snapshot.charts.window_ms);
  renderLag(snapshot.charts.lag, snapshot.charts.window_ms);
  renderSwimlane(snapshot.charts.swimlane);
  renderClaims(snapshot.charts.claims);
  renderThreads(snapshot.charts.threads);
}

// What the page shows is no longer current: the server cannot read the bus
// (it says why, and tries again), or the page cannot reach the server (the
// browser reconnects by itself). The next snapshot makes it live again.
function stale(why) {
  const live = document.getElementById("live");
  live.textContent = "stale: " + why;
  live.className = "stale";
}

function failed(failure) {
  stale("since " + new Date(failure.since_ms).toISOString() + ", " + failure.error);
}

// The server sends a snapshot (or why it has none) at least every two seconds;
// a page that hears nothing for much longer is not seeing the bus any more.
const SILENCE_MS = 10000;
let silence = null;

function expectNews() {
  clearTimeout(silence);
  silence = setTimeout(() => stale("nothing from the server for 10 s"), SILENCE_MS);
}

const events = new EventSource("/events");
events.onmessage = (event) => {
  expectNews();
  const data = JSON.parse(event.data);
  if (data.error !== undefined) { failed(data); } else { render(data); }
};
events.onerror = () => stale("the server does not answer; reconnecting");
expectNews();
