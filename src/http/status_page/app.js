// Keeps the replicator status page live: polls status.json every POLL_MS (less often when the
// node is slow to answer) with the current filter and page, re-renders the tables, and draws
// documents written per second (from the node's counter) as a sparkline. Values are inserted
// as text, never as markup.
"use strict";
(function () {
  const POLL_MS = 1000;
  const SPARK_POINTS = 60;
  const form = document.getElementById("filter");
  let skip = 0;
  let samples = []; // [now_ms, docs_written_total]
  let lastDocs = new Map(); // job id -> [now_ms, docs_written]

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function query() {
    const p = new URLSearchParams();
    p.set("skip", String(skip));
    p.set("limit", form.limit.value);
    if (form.state.value) p.set("state", form.state.value);
    if (form.q.value.trim()) p.set("q", form.q.value.trim());
    if (form.sort.value) p.set("sort", form.sort.value);
    return p.toString();
  }

  function rate(prev, now, value) {
    if (!prev || now[0] <= prev[0]) return null;
    return Math.max(0, (value - prev[1]) * 1000 / (now[0] - prev[0]));
  }

  function jobRow(j, now) {
    const tr = el("tr");
    tr.dataset.jobId = j.job_id;
    const id = el("td", j.job_id, "id");
    if (j.rep_id) id.title = j.rep_id;
    tr.append(id, el("td", j.state, "state state-" + j.state), el("td", j.source),
      el("td", j.target), el("td", j.node), el("td", j.docs_written, "num docs"));
    const prev = lastDocs.get(j.job_id);
    const r = rate(prev, [now, 0], j.docs_written);
    lastDocs.set(j.job_id, [now, j.docs_written]);
    tr.append(el("td", r === null ? "" : r.toFixed(1), "num rate"),
      el("td", j.changes_pending, "num"), el("td", j.lag_seconds, "num lag"),
      el("td", j.error_count, "num"));
    let reason = j.reason || "";
    if (j.retry_in_s !== null && j.retry_in_s !== undefined) reason += " (retry in " + j.retry_in_s + " s)";
    tr.append(el("td", reason, "reason"));
    return tr;
  }

  function spark(s) {
    samples.push([s.now_ms, s.docs_written_total]);
    if (samples.length > SPARK_POINTS + 1) samples.shift();
    const rates = [];
    for (let i = 1; i < samples.length; i++) rates.push(rate(samples[i - 1], samples[i], samples[i][1]) || 0);
    const svg = document.getElementById("spark");
    svg.replaceChildren();
    const max = Math.max(1, ...rates);
    // Oldest at the left edge, newest at the right; one step per poll once the window is full.
    if (rates.length === 1) rates.unshift(rates[0]);
    const step = 300 / Math.max(1, rates.length - 1);
    const pts = rates.map((v, i) => (i * step).toFixed(1) + "," + (58 - v * 56 / max).toFixed(1));
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
    svg.dataset.samples = String(samples.length);
    document.getElementById("rate").textContent = rates.length ? rates[rates.length - 1].toFixed(1) : "–";
    document.getElementById("written").textContent = String(s.docs_written_total);
  }

  function render(s) {
    const c = s.counts;
    document.getElementById("summary").textContent = c.total + " jobs: " + c.running + " running, " +
      c.pending + " pending, " + c.crashing + " crashing, " + c.completed + " completed, " + c.failed + " failed, " + c.paused + " paused";
    spark(s);
    document.getElementById("nodes").replaceChildren(...s.nodes.map((n) => {
      const li = el("li", n.name + (n.this_node ? " (this node)" : "") + " ", n.alive ? "up" : "down");
      li.append(el("small", n.age_ms + " ms ago"));
      return li;
    }));
    document.getElementById("queues").replaceChildren(...s.queues.map((q) =>
      el("li", q.job_type + ": " + q.pending + " pending, " + q.due + " due")));
    const rows = s.jobs.rows.map((j) => jobRow(j, s.now_ms));
    document.querySelector("#jobs tbody").replaceChildren(...rows);
    const last = Math.min(s.jobs.skip + s.jobs.rows.length, s.jobs.matching);
    document.getElementById("pageinfo").textContent =
      (s.jobs.matching ? s.jobs.skip + 1 : 0) + "–" + last + " of " + s.jobs.matching;
    document.getElementById("prev").disabled = s.jobs.skip === 0;
    document.getElementById("next").disabled = last >= s.jobs.matching;
    document.getElementById("live").textContent = "live: updated " + new Date(s.now_ms).toLocaleTimeString();
  }

  let timer = null;
  async function poll() {
    clearTimeout(timer);
    const started = performance.now();
    try {
      const r = await fetch("/_utils/replicator/status.json?" + query(), { credentials: "same-origin" });
      if (r.ok) render(await r.json());
      else document.getElementById("live").textContent = "live: the node answered " + r.status;
    } catch (e) {
      document.getElementById("live").textContent = "live: the node is unreachable";
    }
    // One request in flight at most, and a slow node (10,000 jobs take ~0.3 s to list) is
    // asked at most half of the time.
    timer = setTimeout(poll, Math.max(POLL_MS, 2 * (performance.now() - started)));
  }

  form.addEventListener("input", () => { skip = 0; poll(); });
  form.addEventListener("submit", (e) => e.preventDefault());
  document.getElementById("prev").addEventListener("click", () => {
    skip = Math.max(0, skip - Number(form.limit.value)); poll();
  });
  document.getElementById("next").addEventListener("click", () => {
    skip += Number(form.limit.value); poll();
  });
  poll();
})();
