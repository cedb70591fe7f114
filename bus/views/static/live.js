// Every page but the overview: what it shows was read once, at data-read-ms,
// up to seq data-last-seq (which browse.js moves on when it shows newer results,
// and then sends "bus-read"). The server's event stream (one reader for every page)
// tells it whether the bus has moved on since, or cannot be read at all:
// - the bus cannot be read: "stale: since T, <why>";
// - the page is older than STALE_AFTER_MS and newer messages exist: "stale: read at T,
//   N newer messages; reload";
// - nothing heard from the server for SILENCE_MS: "stale: nothing from the server".
"use strict";

const STALE_AFTER_MS = 5000;
const SILENCE_MS = 10000;
const marker = document.getElementById("live");
let latest = null;
let failure = marker.className === "stale" ? "the bus could not be read" : null;
let silence = null;

function iso(ms) { return new Date(ms).toISOString(); }

function show(text, stale) {
  marker.textContent = text;
  marker.className = stale ? "stale" : "";
}

function judge() {
  if (failure !== null) { show("stale: " + failure, true); return; }
  const readMs = Number(document.body.dataset.readMs);
  const pageSeq = Number(document.body.dataset.lastSeq);
  const age = Date.now() - readMs;
  const newer = latest === null ? 0 : latest.status.log.last_seq - pageSeq;
  if (newer > 0 && age > STALE_AFTER_MS) {
    show(`stale: read at ${iso(readMs)}, ${newer} newer messages since; reload`, true);
  } else {
    show(`read at ${iso(readMs)}` + (newer > 0 ? `, ${newer} newer messages` : ", current"),
         false);
  }
}

function expectNews() {
  clearTimeout(silence);
  silence = setTimeout(() => { failure = "nothing from the server for 10 s"; judge(); },
                       SILENCE_MS);
}

const events = new EventSource("/events?brief=1");
events.onmessage = (event) => {
  expectNews();
  const data = JSON.parse(event.data);
  if (data.error !== undefined) {
    failure = "since " + iso(data.since_ms) + ", " + data.error;
  } else {
    latest = data;
    failure = null;
  }
  judge();
};
events.onerror = () => { failure = "the server does not answer; reconnecting"; judge(); };
document.addEventListener("bus-read", judge);
setInterval(judge, 1000);
expectNews();
