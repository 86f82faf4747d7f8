// Confirms actions and keeps the page's job statuses live from /admin/events (SSE).
"use strict";

document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

function applyEvent(ev) {
  for (const el of document.querySelectorAll(`[data-job="${CSS.escape(ev.id)}"]`)) {
    const status = el.querySelector("[data-status]");
    if (status && ev.status) {
      status.textContent = ev.status;
      status.className = `status s-${ev.status}`;
    }
    // A job page's actions: each form names the statuses it takes.
    for (const form of el.querySelectorAll("form[data-shown-for]")) {
      if (ev.status) form.hidden = !form.dataset.shownFor.split(" ").includes(ev.status);
    }
    const attempts = el.querySelector("[data-attempts]");
    if (attempts && ev.attempts != null && ev.max_attempts != null) {
      attempts.textContent = `${ev.attempts}/${ev.max_attempts}`;
    }
    const progress = el.querySelector("[data-progress]");
    if (progress && ev.progress) {
      const p = ev.progress;
      const pct = p.percent == null ? "" : ` (${Math.round(p.percent)} %)`;
      const attempt = p.attempt ? ` – attempt ${p.attempt}/${p.max_attempts}` : "";
      progress.textContent = `${p.message}${pct}${attempt}`;
    }
  }
}

const shown = [...new Set([...document.querySelectorAll("[data-job]")].map((el) => el.dataset.job))];
if (shown.length) {
  // The stream opens with these jobs as they are now: a change between the page's render and
  // the stream's start (a cancel that lands at once) would otherwise never reach the page.
  const source = new EventSource(`/admin/events?jobs=${shown.join(",")}`);
  const live = document.getElementById("live");
  source.onopen = () => { document.body.dataset.live = "on"; if (live) live.textContent = "live: on"; };
  source.onerror = () => {
    // A stream refused outright (its session ended: 401) is closed for good, not retried.
    const closed = source.readyState === EventSource.CLOSED;
    document.body.dataset.live = closed ? "closed" : "off";
    if (live) live.textContent = closed ? "live: off, reload the page" : "live: reconnecting";
  };
  source.onmessage = (message) => {
    const ev = JSON.parse(message.data);
    applyEvent(ev);
    // Other scripts of the page (the workflow graph) follow the same stream.
    document.dispatchEvent(new CustomEvent("job-event", { detail: ev }));
  };
}

// The dashboard: its body fetched again every 5 s (the numbers change by the minute, not by
// the job, so a periodic fetch is cheaper than reacting to every job event).
// A refresh that fails says so: the figures shown stop changing, and an ended session (401)
// never comes back by itself. A 429 (this token's heavy pages all busy) is skipped quietly.
const dashboard = document.getElementById("dashboard");
const stale = document.getElementById("dashboard-stale");
if (dashboard) {
  let refreshed = 0;
  const failed = (why) => {
    stale.hidden = false;
    stale.textContent = `Not refreshed since ${new Date().toISOString().slice(11, 19)} UTC: ${why}.`;
  };
  setInterval(async () => {
    let response;
    try {
      response = await fetch(dashboard.dataset.refresh, { credentials: "same-origin" });
    } catch {
      failed("the admin view does not answer");
      return;
    }
    if (response.ok) {
      dashboard.innerHTML = await response.text();
      document.body.dataset.refreshed = String(++refreshed);
      stale.hidden = true;
    } else if (response.status === 401) {
      failed("the session has ended; reload the page to log in again");
    } else if (response.status !== 429) {
      failed(`the admin view answered ${response.status}`);
    }
  }, 5000);
}
