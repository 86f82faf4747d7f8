// The workflow page: node statuses follow the live stream admin.js opens (its "job-event"s,
// each confirmed by the server under the token's scope), and a node's retry is sent in place,
// so the page keeps its state and watches the graph come back.
"use strict";

const RETRYABLE = new Set(["error", "cancelled"]);

document.addEventListener("job-event", (event) => {
  const ev = event.detail;
  if (!ev.status) return;
  const node = document.querySelector(`#graph [data-node="${CSS.escape(ev.id)}"]`);
  if (node) {
    const focus = node.classList.contains("focus") ? " focus" : "";
    node.setAttribute("class", `node s-${ev.status}${focus}`);
    const text = node.querySelector("[data-node-status]");
    if (text) text.textContent = ev.status;
  }
  const form = document.querySelector(`tr[data-job="${CSS.escape(ev.id)}"] form.node-retry`);
  if (form) form.hidden = !RETRYABLE.has(ev.status);
  document.body.dataset.events = String(Number(document.body.dataset.events || 0) + 1);
});

document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (!form.matches("form[data-fetch]") || event.defaultPrevented) return;
  event.preventDefault();
  const message = document.getElementById("graph-message");
  const response = await fetch(form.action, {
    method: "POST",
    body: new FormData(form),
    credentials: "same-origin",
  });
  const done = response.ok && !response.url.includes("done=none");
  form.hidden = done;
  if (message) {
    message.hidden = false;
    message.className = done ? "notice" : "error";
    message.textContent = done
      ? "Retried: the job and the jobs it cancelled are back in the queue."
      : "Nothing done: the job is not in a state for that.";
  }
});
