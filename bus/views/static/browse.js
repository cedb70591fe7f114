// The message browser without a navigation: a filter applied, or a page turned, inside
// the open /messages page. The form and the links stay plain (without this script they
// navigate, as before): this script asks the same URL for the results alone (header
// X-Bus-Fragment), puts them in place of the ones shown, puts the URL in the history
// (every filter stays in the URL: a reload, a shared link, back and forward show the
// same), and tells live.js when they were read. Anything but results (the bus cannot
// be read, the server is gone) is left to a navigation to the same URL.
// The time from the click to the new rows laid out is the "bus-results" measure
// (scripts/bench_views.py reads it).
"use strict";

const filters = document.getElementById("filters");
let asked = 0;  // the newest request: an older answer arriving later is dropped

function filtersUrl() {
  const params = new URLSearchParams();
  for (const [name, value] of new FormData(filters)) {
    if (value.trim() !== "") params.append(name, value.trim());
  }
  const query = params.toString();
  return "/messages" + (query ? "?" + query : "");
}

function fillFilters(url) {
  const params = new URL(url, location.href).searchParams;
  for (const input of filters.querySelectorAll("input[name]")) {
    input.value = params.get(input.name) || "";
  }
}

async function showResults(url, startedMs, push) {
  const mine = ++asked;
  let answer;
  try {
    answer = await fetch(url, {headers: {"X-Bus-Fragment": "results"}});
  } catch (error) {
    location.assign(url);
    return;
  }
  if (!answer.ok) { location.assign(url); return; }
  const results = await answer.text();
  if (mine !== asked) return;
  document.getElementById("results").outerHTML = results;
  void document.getElementById("results").offsetHeight;  // lay the rows out, then time
  performance.measure("bus-results", {start: startedMs, end: performance.now()});
  if (push) {
    history.pushState(null, "", url);
    const shown = document.getElementById("results");
    if (shown.getBoundingClientRect().top < 0) shown.scrollIntoView();  // as a new page would
  }
  fillFilters(url);
  document.body.dataset.readMs = answer.headers.get("X-Bus-Read-Ms");
  document.body.dataset.lastSeq = answer.headers.get("X-Bus-Last-Seq");
  document.dispatchEvent(new Event("bus-read"));
}

filters.addEventListener("submit", (event) => {
  event.preventDefault();
  showResults(filtersUrl(), event.timeStamp, true);
});

// Links to the browser itself: paging, "clear", a type; not a message's own page.
document.querySelector("main").addEventListener("click", (event) => {
  const link = event.target.closest("a");
  if (link === null || link.origin !== location.origin || link.pathname !== "/messages"
      || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey
      || event.altKey) {
    return;
  }
  event.preventDefault();
  showResults(link.href, event.timeStamp, true);
});

window.addEventListener("popstate", () => showResults(location.href, performance.now(), false));
