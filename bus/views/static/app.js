// The live page: every server-sent event is a whole snapshot {status, charts};
// the page only renders it (and keeps the lag history for its chart).
"use strict";

const LAG_POINTS_MAX = 600;
const lagHistory = {};  // consumer -> {x: [dates], y: [lags]}
const layoutBase = {margin: {t: 40, r: 20, b: 40, l: 60}, legend: {orientation: "h"}};

function text(id, value) { document.getElementById(id).textContent = value; }

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
}

function table(id, columns, rows) {
  const head = "<tr>" + columns.map((c) => `<th>${c}</th>`).join("") + "</tr>";
  const body = rows.map((r) => "<tr>" + r.map((v) => `<td>${escape(v)}</td>`).join("") + "</tr>");
  document.getElementById(id).innerHTML = head + (body.join("") || `<tr><td>none</td></tr>`);
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
        s.consumers.map((c) => [c.agent, c.kind, c.cursor, c.pending, c.lag]));
  table("agents", ["agent", "state", "silent s", "status", "task"],
        s.agents.map((a) => [a.agent, a.state, a.age_s.toFixed(1), a.status, a.task]));
  table("claims", ["task", "holder", "fence", "lease left s", "attempt"],
        s.claims.claims.map((c) => [c.task_id, c.agent, c.fence,
                                    ((c.lease_until_ms - s.now_ms) / 1000).toFixed(1),
                                    c.attempts + "/" + c.max_attempts]));
  table("channels", ["channel", "type", "open", "awaiting ack", "dead letters"],
        s.channels.map((c) => [c.name, c.type, c.open_deliveries, c.awaiting_ack, c.dead_letters]));
  table("reservations", ["pattern", "holder", "mode", "expires", "reason"],
        s.reservations.map((r) => [r.pattern, r.agent, r.mode,
                                   new Date(r.expires_at_ms).toISOString(), r.reason]));
}

function renderRate(rate) {
  const traces = Object.entries(rate).map(([type, series]) => ({
    name: type, type: "bar", x: series.t.map((t) => new Date(t * 1000)), y: series.n}));
  plot("chart-rate", "messages per second by type", traces,
       {barmode: "stack", xaxis: {type: "date"}});
}

function renderLag(lag, nowMs) {
  for (const [consumer, value] of Object.entries(lag)) {
    const series = lagHistory[consumer] || (lagHistory[consumer] = {x: [], y: []});
    series.x.push(new Date(nowMs));
    series.y.push(value);
    if (series.x.length > LAG_POINTS_MAX) { series.x.shift(); series.y.shift(); }
  }
  const traces = Object.entries(lagHistory).map(([name, s]) => ({
    name, type: "scatter", mode: "lines+markers", x: s.x, y: s.y}));
  plot("chart-lag", "consumer lag (messages behind)", traces, {xaxis: {type: "date"}});
}

function renderSwimlane(segments) {
  const byState = {};
  for (const seg of segments) {
    const t = byState[seg.state] || (byState[seg.state] = {
      name: seg.state, type: "bar", orientation: "h", x: [], y: [], base: []});
    t.x.push(Math.max(seg.end_ms - seg.start_ms, 1));
    t.y.push(seg.worker);
    t.base.push(new Date(seg.start_ms).toISOString());
  }
  plot("chart-swimlane", "worker states over time", Object.values(byState),
       {barmode: "overlay", xaxis: {type: "date"}});
}

function renderClaims(claims) {
  const agents = Object.keys(claims);
  plot("chart-claims", "claims and takeovers by holder", [
    {name: "held", type: "bar", x: agents, y: agents.map((a) => claims[a].held)},
    {name: "taken over", type: "bar", x: agents, y: agents.map((a) => claims[a].taken_over)},
  ], {barmode: "group"});
}

function renderThreads(threads) {
  plot("chart-threads", "pump conversations (call trees)", [{
    type: "sunburst", ids: threads.ids, parents: threads.parents, labels: threads.labels,
    branchvalues: "remainder"}], {});
}

// Counts and tables first, at once; the charts after the browser has painted
// them (Plotly takes a while), and only for the newest snapshot if several came.
let chartsDue = null;

function render(snapshot) {
  const s = snapshot.status;
  renderCounts(s);
  renderTables(s);
  const live = document.getElementById("live");
  live.textContent = "live, as of " + new Date(s.now_ms).toISOString();
  live.className = "";
  if (chartsDue === null) { setTimeout(() => renderCharts(chartsDue), 0); }
  chartsDue = snapshot;
}

function renderCharts(snapshot) {
  chartsDue = null;
  renderRate(snapshot.charts.rate);
  renderLag(snapshot.charts.lag, snapshot.status.now_ms);
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
