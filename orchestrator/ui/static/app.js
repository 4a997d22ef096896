/* orch ui: the page. Plain script, no build step, no framework.
 *
 * Everything a job or a host says is put in the document as text (text nodes,
 * textContent), never as HTML: a rank's `<script>` shows as those characters.
 * Every request carries the token (in its address, or the X-Orch-Token header for
 * an action, which is a POST).
 */
"use strict";

(function () {
  const TOKEN = new URLSearchParams(location.search).get("token") || "";
  const MAX_LINES = 20000;      // lines a job page holds
  const MAX_DOM_LINES = 2000;   // lines in the document at once (filtered)
  const MAX_RANK_SERIES = 64;   // per-rank curves drawn at once
  const CHART_EVERY_MS = 1900;  // a curve is redrawn this often at most
  const main = document.getElementById("main");
  const conn = document.getElementById("conn");
  let page = null;              // the current page: {close()}
  let features = {};

  // ------------------------------------------------------------ helpers

  function url(path, params) {
    const q = new URLSearchParams(params || {});
    q.set("token", TOKEN);
    return path + "?" + q.toString();
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function stateBadge(state) {
    return el("span", { class: "state state-" + state, "data-state": state }, state);
  }

  function when(seconds) {
    if (!seconds) return "";
    const d = new Date(seconds * 1000);
    return d.toLocaleString(undefined, { hour12: false });
  }

  function span(seconds) {
    if (seconds === null || seconds === undefined) return "";
    seconds = Math.max(0, Math.round(seconds));
    const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
    return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(s).padStart(2, "0")}s` : `${s}s`;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return n.toFixed(i ? 1 : 0) + " " + units[i];
  }

  function percent(v) {
    return v === null ? "" : `${v.toFixed(v < 10 ? 1 : 0)}%`;
  }

  function duration(row) {
    if (!row.started) return "";
    const end = row.ended || Date.now() / 1000;
    return span(end - row.started);
  }

  function events(path, handlers) {
    const source = new EventSource(url(path));
    source.onopen = () => { conn.textContent = "live"; conn.className = "conn"; };
    source.onerror = () => { conn.textContent = "reconnecting…"; conn.className = "conn down"; };
    for (const [name, fn] of Object.entries(handlers)) {
      source.addEventListener(name, (e) => fn(JSON.parse(e.data)));
    }
    return source;
  }

  async function getJSON(path, params) {
    const r = await fetch(url(path, params));
    return r.json();
  }

  function navigate() {
    if (page) page.close();
    main.replaceChildren();
    const hash = location.hash || "#/";
    const [route, query] = hash.slice(1).split("?");
    const params = new URLSearchParams(query || "");
    for (const a of document.querySelectorAll("header nav a")) a.classList.remove("active");
    const nav = (name) => document.querySelector(`header nav a[data-nav="${name}"]`).classList.add("active");
    if (route.startsWith("/job/")) { nav("jobs"); page = jobPage(decodeURIComponent(route.slice(5))); }
    else if (route === "/hosts") { nav("hosts"); page = hostsPage(); }
    else if (route === "/compare") { nav("compare"); page = comparePage(params); }
    else { nav("jobs"); page = jobsPage(); }
  }

  // ------------------------------------------------------------ the jobs

  function jobsPage() {
    const stateFilter = el("select", { id: "state-filter" },
      ...["all", "running", "pending", "succeeded", "failed", "killed", "lost"].map(
        (s) => el("option", { value: s }, s)));
    const nameFilter = el("input", { id: "name-filter", type: "search", placeholder: "name or id" });
    const body = el("tbody");
    const note = el("div", { class: "message bad" });
    const table = el("table", { id: "jobs" },
      el("thead", {}, el("tr", {}, ...["job", "state", "nodes", "user", "started", "duration", "exit", ""].map((h) => el("th", {}, h)))),
      body);
    main.append(el("div", { class: "panel" },
      el("div", { class: "row" }, el("h1", { class: "grow" }, "Jobs"), stateFilter, nameFilter),
      note, table));
    let rows = [];
    const draw = () => {
      const want = stateFilter.value, text = nameFilter.value.toLowerCase();
      const shown = rows.filter((r) => (want === "all" || r.state === want) &&
        (!text || r.name.toLowerCase().includes(text) || r.id.toLowerCase().includes(text)));
      body.replaceChildren(...shown.map((r) => el("tr", { "data-job": r.id },
        el("td", {}, el("a", { href: "#/job/" + encodeURIComponent(r.id) }, r.name),
          el("div", { class: "muted mono" }, r.id)),
        el("td", {}, stateBadge(r.state), r.place ? el("div", { class: "muted" }, r.place) : null,
          r.note ? el("div", { class: "muted" }, r.note) : null),
        el("td", { class: "wrap" }, `${r.nodes.length}: ` + r.nodes.map((n) => n.host).join(", ")),
        el("td", {}, r.user),
        el("td", {}, when(r.started || r.created)),
        el("td", { "data-duration": r.id }, duration(r)),
        el("td", {}, r.exit_code === null ? "" : String(r.exit_code)),
        el("td", {}, el("label", {}, el("input", { type: "checkbox", "data-compare": r.id }), " compare")))));
    };
    stateFilter.addEventListener("change", draw);
    nameFilter.addEventListener("input", draw);
    const compare = el("button", { onclick: () => {
      const ids = [...document.querySelectorAll("input[data-compare]:checked")].map((c) => c.dataset.compare);
      location.hash = "#/compare?ids=" + encodeURIComponent(ids.join(","));
    } }, "compare the checked jobs' curves");
    main.append(el("div", { class: "row" }, compare));
    const source = events("/api/jobs/events", {
      jobs: (data) => {
        rows = data.rows;
        note.textContent = data.error || "";
        const checked = new Set([...document.querySelectorAll("input[data-compare]:checked")].map((c) => c.dataset.compare));
        draw();
        for (const c of document.querySelectorAll("input[data-compare]")) c.checked = checked.has(c.dataset.compare);
      },
    });
    const timer = setInterval(() => {
      for (const r of rows) {
        if (r.ended || !r.started) continue;
        const cell = body.querySelector(`td[data-duration="${CSS.escape(r.id)}"]`);
        if (cell) cell.textContent = duration(r);
      }
    }, 1000);
    return { close() { source.close(); clearInterval(timer); } };
  }

  // ------------------------------------------------------------ a job

  function jobPage(jobId) {
    const head = el("div", { class: "panel", id: "job-head" });
    const nodes = el("div", { class: "panel" }, el("h2", {}, "Nodes"));
    const ranks = el("div", { class: "panel" }, el("h2", {}, "Ranks"), el("div", { class: "muted", id: "ranks-note" }, "sampled every few seconds while the job runs"));
    const curves = el("div", { class: "panel", id: "curves" }, el("h2", {}, "Curves"));
    const logPanel = el("div", { class: "panel" }, el("h2", {}, "Log"));
    main.append(head, el("div", { class: "grid2" }, nodes, ranks), curves, logPanel);

    // the log
    const rankFilter = el("select", { id: "rank-filter" }, el("option", { value: "all" }, "every rank"));
    const search = el("input", { id: "log-search", type: "search", placeholder: "search the log" });
    const follow = el("input", { type: "checkbox", id: "log-follow", checked: true });
    const count = el("span", { class: "muted", id: "log-count" });
    const bars = el("div", { class: "bars", id: "bars" });
    const log = el("div", { id: "log", role: "log" });
    logPanel.append(el("div", { class: "row" }, rankFilter, search,
      el("label", {}, follow, " follow"), count), bars, log);
    const lines = [];
    const known = new Set();
    let skipped = 0;
    const matches = (line) => {
      const want = rankFilter.value;
      if (want !== "all") {
        if (want.startsWith("r")) { if (String(line[2]) !== want.slice(1)) return false; }
        else if (want.startsWith("h")) { if (line[1] !== want.slice(1)) return false; }
      }
      const text = search.value;
      return !text || line[4].toLowerCase().includes(text.toLowerCase());
    };
    const row = (line) => {
      const [, host, rank, kind, text] = line;
      const prefix = kind === "notice" ? "[orch] " : kind === "setup" ? `[${host} setup] ` :
        rank === null ? `[${host}] ` : `[${host} r${rank}] `;
      return el("div", { class: "line kind-" + kind },
        el("span", { class: "prefix" }, prefix), text);
    };
    const atBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 40;
    const redraw = () => {
      const shown = [];
      for (let i = lines.length - 1; i >= 0 && shown.length < MAX_DOM_LINES; i--) {
        if (matches(lines[i])) shown.push(lines[i]);
      }
      shown.reverse();
      log.replaceChildren(...shown.map(row));
      count.textContent = `${lines.length} lines` + (skipped ? ` (${skipped} earlier ones not kept)` : "");
      if (follow.checked) log.scrollTop = log.scrollHeight;
    };
    rankFilter.addEventListener("change", redraw);
    search.addEventListener("input", redraw);
    const addRankOption = (host, rank) => {
      const key = rank === null ? "h" + host : "r" + rank;
      if (known.has(key)) return;
      known.add(key);
      const label = rank === null ? `${host} (torchrun)` : `rank ${rank} (${host})`;
      const option = el("option", { value: key }, label);
      // ranks in order, then each host's own lines
      let after = null;
      if (rank !== null) {
        for (const o of rankFilter.options) {
          if (o.value[0] === "h" || (o.value[0] === "r" && Number(o.value.slice(1)) > rank)) { after = o; break; }
        }
      }
      rankFilter.insertBefore(option, after);
    };
    const takeLines = (data) => {
      const stick = follow.checked && atBottom();
      skipped += data.skipped;
      const fragment = document.createDocumentFragment();
      for (const line of data.lines) {
        lines.push(line);
        if (line[3] !== "notice") addRankOption(line[1], line[2]);
        if (matches(line)) fragment.append(row(line));
      }
      if (lines.length > MAX_LINES) { const cut = lines.length - MAX_LINES; lines.splice(0, cut); skipped += cut; }
      log.append(fragment);
      while (log.childElementCount > MAX_DOM_LINES) log.firstElementChild.remove();
      count.textContent = `${lines.length} lines` + (skipped ? ` (${skipped} earlier ones not kept)` : "");
      if (stick || follow.checked) log.scrollTop = log.scrollHeight;
    };
    const drawBars = (data) => {
      bars.replaceChildren(...data.shown.map(([host, rank, text]) => {
        return el("div", { class: "bar" }, el("span", { class: "prefix" }, rank === null ? `[${host}]` : `[${host} r${rank}]`), text);
      }));
      if (data.hidden) {
        const spread = data.low !== null ? ` (${Math.round(data.low * 100)}% to ${Math.round(data.high * 100)}%)` : "";
        bars.append(el("div", { class: "bar muted" }, `and ${data.hidden} more bars${spread}`));
      }
    };

    // the head, nodes, timeline
    const timeline = attemptsTimeline(jobId);
    let current = null;
    const message = el("div", { class: "message", id: "action-message" });
    const kill = el("button", { class: "danger", id: "kill", onclick: async () => {
      if (!current) return;
      if (!confirm(`Kill job ${current.id} on every host?`)) return;
      kill.disabled = true;
      message.textContent = "killing…";
      const r = await fetch(url("/api/action/kill/" + encodeURIComponent(current.id), {}),
        { method: "POST", headers: { "X-Orch-Token": TOKEN } });
      const data = await r.json();
      if (!r.ok) { message.textContent = data.error + (data.hint ? " — " + data.hint : ""); message.className = "message bad"; kill.disabled = false; return; }
      message.className = "message";
      message.textContent = data.already ? `had already ended (${data.already})` : data.notes.length ? data.notes.join("; ") :
        "killed: " + Object.entries(data.killed).map(([h, n]) => `${h} ${n} processes`).join(", ") +
        (data.unreachable.length ? "; not reached: " + data.unreachable.join("; ") : "");
    } }, "Kill");
    // Every rank's stack, grouped, as orch stack prints it (features.stack).
    const stackOut = el("pre", { id: "stack-output", class: "mono scroll", hidden: true });
    const stack = el("button", { id: "stack", hidden: !features.stack, onclick: async () => {
      if (!current) return;
      stack.disabled = true;
      const r = await fetch(url("/api/action/stack/" + encodeURIComponent(current.id), {}),
        { method: "POST", headers: { "X-Orch-Token": TOKEN } });
      const data = await r.json();
      stackOut.hidden = false;
      stackOut.textContent = r.ok ? data.text : data.error;
      stack.disabled = false;
    } }, "Stacks");
    const csv = el("a", { href: url("/api/job/" + encodeURIComponent(jobId) + "/curves.csv"), id: "csv" }, "curves as CSV");
    const dryRunText = el("pre", { class: "mono scroll", id: "dry-run" });
    const dryRun = el("details", { ontoggle: async (e) => {
      if (!e.target.open || dryRunText.textContent) return;
      dryRunText.textContent = "…";
      const data = await getJSON("/api/job/" + encodeURIComponent(jobId) + "/dry-run");
      dryRunText.textContent = data.error ? `${data.error}\n${data.hint || ""}` : data.lines.join("\n");
    } }, el("summary", {}, "command lines: what orch submit --dry-run prints for its job file now"), dryRunText);
    const drawHead = (row) => {
      current = row;
      for (const n of row.nodes) {
        addRankOption(n.host, null);
        for (let r = n.ranks[0]; r < n.ranks[1]; r++) addRankOption(n.host, r);
      }
      const running = !["succeeded", "failed", "killed", "lost"].includes(row.state);
      kill.disabled = !running;
      stack.disabled = !running;
      timeline.want(row);
      head.replaceChildren(
        el("div", { class: "row" }, el("h1", { class: "grow" }, row.name, " ", el("span", { class: "muted mono" }, row.id)),
          stateBadge(row.state), kill, stack, csv),
        message, stackOut,
        el("div", { class: "kv" },
          el("div", {}, "command"), el("div", { class: "mono wrap" }, [row.entry, ...row.args].join(" ")),
          el("div", {}, "job file"), el("div", { class: "mono" }, row.path || ""),
          el("div", {}, "user"), el("div", {}, row.user),
          el("div", {}, "started"), el("div", {}, when(row.started || row.created)),
          el("div", {}, "duration"), el("div", { id: "job-duration" }, duration(row)),
          el("div", {}, "exit code"), el("div", { id: "job-exit" }, row.exit_code === null ? "" : String(row.exit_code)),
          el("div", {}, "master"), el("div", { class: "mono" }, row.master),
          el("div", {}, "restarts"), el("div", {}, `${row.attempt} of ${row.restarts}`),
          el("div", {}, "outputs"), el("div", { class: "mono" }, row.outputs.join(" ") || "none"),
          el("div", {}, "metrics"), el("div", { class: "mono" }, row.metrics.join("  ") || "the default forms")),
        el("h2", {}, "Attempts"), timeline.box, dryRun);
      nodes.replaceChildren(el("h2", {}, "Nodes"), el("div", { class: "scroll" }, el("table", { id: "nodes" },
        el("thead", {}, el("tr", {}, ...["host", "node rank", "ranks", "state", "exit", "why"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...row.nodes.map((n) => el("tr", { "data-host": n.host },
          el("td", {}, n.host, el("div", { class: "muted mono" }, n.address)),
          el("td", {}, String(n.node_rank)),
          el("td", {}, n.ranks[1] - n.ranks[0] === 1 ? `r${n.ranks[0]}` : `r${n.ranks[0]}–r${n.ranks[1] - 1}`),
          el("td", {}, stateBadge(n.state)),
          el("td", {}, n.signal || (n.exit_code === null ? "" : String(n.exit_code))),
          el("td", { class: "wrap" }, n.error || "")))))));
    };

    // the ranks, from the samples
    let top = null, topAt = 0;
    const rankBody = el("tbody");
    ranks.append(el("div", { class: "scroll" }, el("table", { id: "ranks" },
      el("thead", {}, el("tr", {}, ...["rank", "host", "CPU", "memory", "lines/s", "last line", "behind"].map((h) => el("th", {}, h)))),
      rankBody)));
    let idleCells = [];  // [cell, idle seconds at the sample]
    const drawRanks = () => {
      if (!top) return;
      idleCells = [];
      rankBody.replaceChildren(...top.nodes.flatMap((n) => n.state === "unreachable"
        ? [el("tr", { "data-host": n.host }, el("td", {}, ""), el("td", {}, n.host), el("td", { colspan: 5 }, stateBadge("lost"), " ", n.error || ""))]
        : n.ranks.filter((r) => r.rank !== null).map((r) => {
          const idle = el("td", {});
          if (r.idle_s !== null) idleCells.push([idle, r.idle_s]);
          return el("tr", { "data-rank": r.rank },
            el("td", {}, `r${r.rank}`), el("td", {}, n.host),
            el("td", {}, r.cpu_percent === null ? "" : `${Math.round(r.cpu_percent)}%`),
            el("td", {}, bytes(r.rss_bytes)),
            el("td", {}, r.lines_per_s === null ? "" : r.lines_per_s.toFixed(1)),
            idle,
            el("td", { class: "wrap" }, r.behind || ""));
        })));
      tickRanks();
    };
    const tickRanks = () => {
      const since = (Date.now() - topAt) / 1000;
      for (const [cell, idle] of idleCells) cell.textContent = span(idle + since) + " ago";
    };

    // the curves
    const metric = el("select", { id: "metric" });
    const xAxis = el("select", { id: "x-axis" }, el("option", { value: "step" }, "against step"), el("option", { value: "time" }, "against time"));
    const mode = el("select", { id: "curve-mode" }, el("option", { value: "mean" }, "mean of the ranks"), el("option", { value: "ranks" }, "each rank"));
    const info = el("span", { class: "muted", id: "curve-info", "data-points": 0 });
    const chartBox = el("div", { class: "chart", id: "chart" });
    curves.append(el("div", { class: "row" }, metric, xAxis, mode, info), chartBox);
    // name -> {count, ranks: Map(rank -> [[step, time, value]...]), mean: Map(step -> [sum, n, tsum, tn])}:
    // the mean is kept as the points come, so that drawing it costs its steps, not
    // every point of every rank (256 ranks are one curve).
    const series = new Map();
    let chart = null, chartKey = "", dirty = false, truncated = false, drawnAt = 0;
    const takePoints = (data) => {
      truncated = data.truncated;
      for (const [rank, name, step, time, value] of data.points) {
        let one = series.get(name);
        if (!one) {
          one = { count: 0, ranks: new Map(), mean: new Map() };
          series.set(name, one);
          metric.append(el("option", { value: name }, name));
          if (!metric.value || (name.includes("loss") && !metric.value.includes("loss"))) metric.value = name;
        }
        one.count += 1;
        let points = one.ranks.get(rank);
        if (!points) one.ranks.set(rank, points = []);
        points.push([step, time, value]);
        let cell = one.mean.get(step);
        if (!cell) one.mean.set(step, cell = [0, 0, 0, 0]);
        cell[0] += value; cell[1] += 1;
        if (time !== null) { cell[2] += time; cell[3] += 1; }
      }
      dirty = true;
    };
    const drawChart = () => {
      dirty = false;
      drawnAt = Date.now();
      const name = metric.value;
      const one = series.get(name);
      if (!one) { info.textContent = "no numbers found in the ranks' lines yet"; return; }
      const byTime = xAxis.value === "time";
      const ranksShown = [...one.ranks.keys()].sort((a, b) => a - b);
      info.textContent = `${name}: ${one.count} points from ${ranksShown.length} ranks` + (truncated ? " (the first ones only: see the CSV)" : "");
      info.dataset.points = one.count;
      info.dataset.metric = name;
      let data, labels;
      if (mode.value === "mean") {
        let rows = [];
        for (const [step, c] of one.mean) {
          const x = byTime ? (c[3] ? c[2] / c[3] : null) : step;
          if (x !== null) rows.push([x, c[0] / c[1]]);
        }
        rows = rows.sort((a, b) => a[0] - b[0]);
        data = [rows.map((row) => row[0]), rows.map((row) => row[1])];
        labels = [ranksShown.length > 1 ? `mean of ${ranksShown.length} ranks` : `r${ranksShown[0]}`];
      } else {
        const shown = ranksShown.slice(0, MAX_RANK_SERIES);
        const xs = new Set();
        const maps = shown.map((r) => {
          const m = new Map();
          for (const [step, time, value] of one.ranks.get(r)) {
            const x = byTime ? time : step;
            if (x === null) continue;
            m.set(x, value); xs.add(x);
          }
          return m;
        });
        const sorted = [...xs].sort((a, b) => a - b);
        data = [sorted, ...maps.map((m) => sorted.map((x) => (m.has(x) ? m.get(x) : null)))];
        labels = shown.map((r) => `r${r}`);
        if (ranksShown.length > shown.length) info.textContent += ` (the first ${shown.length} drawn)`;
      }
    const key = `${name}|${xAxis.value}|${mode.value}|${labels.length}`;
      if (!chart || key !== chartKey) {
        if (chart) chart.destroy();
        chartKey = key;
        const width = Math.max(chartBox.clientWidth - 10, 300);
        chart = new uPlot({
          width, height: 260,
          scales: { x: { time: byTime } },
          series: [{ label: byTime ? "time" : "step" }, ...labels.map((label, i) => ({
            label, stroke: palette(i, labels.length), width: 1.5, spanGaps: true, points: { show: false },
          }))],
          legend: { show: labels.length <= 16 },
        }, data, chartBox);
      } else {
        chart.setData(data);
      }
    };
    for (const control of [metric, xAxis, mode]) control.addEventListener("change", () => { chartKey = ""; drawChart(); });

    const source = events("/api/job/" + encodeURIComponent(jobId) + "/events", {
      status: drawHead,
      lines: takeLines,
      bars: drawBars,
      points: takePoints,
      top: (data) => { top = data; topAt = Date.now(); drawRanks(); },
      feed: (data) => {
        if (data.error) { message.textContent = "following stopped: " + data.error; message.className = "message bad"; }
      },
    });
    getJSON("/api/job/" + encodeURIComponent(jobId)).then((row) => {
      if (row.error) { head.replaceChildren(el("div", { class: "message bad" }, row.error), el("div", { class: "muted" }, row.hint || "")); source.close(); return; }
      if (!current) drawHead(row);
    });
    const timer = setInterval(() => {
      if (dirty && Date.now() - drawnAt > CHART_EVERY_MS) drawChart();
      if (current && current.started && !current.ended) {
        const cell = document.getElementById("job-duration");
        if (cell) cell.textContent = duration(current);
      }
      tickRanks();
    }, 1000);
    return { close() { source.close(); clearInterval(timer); timeline.close(); if (chart) chart.destroy(); } };
  }

  // ------------------------------------------------------------ a job's attempts on a time line

  const SVG = "http://www.w3.org/2000/svg";
  const ENDED = ["succeeded", "failed", "killed", "lost"];

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.setAttribute("class", v);
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // Each node of each attempt as a span on its host's row, against the time since the
  // job started: its state's colour, a cross where it failed or was lost, a dashed
  // outline where a restart put it on another host than the attempt before (a spare
  // taking a lost node's place), a line where each attempt began. Rows are the hosts in
  // the order they first held a node rank, 32 of them in about 600 pixels.
  function attemptsTimeline(jobId) {
    const box = el("div", { id: "timeline", class: "timeline" }, el("div", { class: "muted" }, "reading the attempts…"));
    let data = null, asked = 0, asking = false, wanted = "";
    const fetchNow = async () => {
      if (asking) return;
      asking = true;
      asked = Date.now();
      try {
        const found = await getJSON("/api/job/" + encodeURIComponent(jobId) + "/timeline");
        if (found.error) box.replaceChildren(el("div", { class: "message bad" }, found.error));
        else { data = found; draw(); }
      } finally { asking = false; }
    };
    const want = (row) => {
      // asked again when the attempt or a node's state changes
      const key = `${row.attempt}|${row.state}|` + row.nodes.map((n) => `${n.host}:${n.state}`).join(",");
      if (key !== wanted) { wanted = key; fetchNow(); }
    };
    const draw = () => {
      if (!data || !data.spans.length) { box.replaceChildren(el("div", { class: "muted" }, "no attempt yet")); return; }
      const now = Date.now() / 1000;
      const spans = data.spans.map((s) => ({ ...s,
        start: s.start === null ? (data.started || now) : s.start,
        end: s.end === null ? (ENDED.includes(s.state) ? (data.ended || now) : now) : s.end }));
      const t0 = Math.min(...spans.map((s) => s.start));
      const t1 = Math.max(t0 + 1, ...spans.map((s) => s.end));
      const hosts = [], cameFor = new Map();  // a spare's row says whose place it took first
      for (const s of spans) {
        if (!hosts.includes(s.host)) hosts.push(s.host);
        if (s.took_place_of && !cameFor.has(s.host)) cameFor.set(s.host, s.took_place_of);
      }
      const label = (host) => host + (cameFor.has(host) ? ` ← ${cameFor.get(host)}` : "");
      const longest = Math.max(...hosts.map((h) => label(h).length));
      const rowH = hosts.length > 24 ? 14 : 20, top = 22, right = 16, bottom = 22;
      const left = Math.min(Math.max(longest * 6.7 + 16, 80), 280);
      const width = Math.max(box.clientWidth - 4, 600);
      const height = top + hosts.length * rowH + bottom;
      const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
      const y = (host) => top + hosts.indexOf(host) * rowH;
      const chart = svg("svg", { width, height, class: "timeline-chart", role: "img",
        "aria-label": `${data.attempts} attempts of ${hosts.length} hosts` });
      // the time axis: the time since the job started, at a round step
      const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 43200, 86400];
      const step = steps.find((s) => (t1 - t0) / s <= 8) || 86400 * Math.ceil((t1 - t0) / 86400 / 8);
      for (let t = 0; t <= t1 - t0; t += step) {
        chart.append(svg("line", { x1: x(t0 + t), x2: x(t0 + t), y1: top - 4, y2: height - bottom, class: "tick" }),
          svg("text", { x: x(t0 + t), y: height - 6, "text-anchor": x(t0 + t) > width - 40 ? "end" : "middle",
            class: "axis", text: t ? "+" + span(t) : new Date(t0 * 1000).toLocaleTimeString(undefined, { hour12: false }) }));
      }
      // each host's row and its name (text from the records: a text node, never markup)
      hosts.forEach((host, i) => {
        if (i % 2) chart.append(svg("rect", { x: 0, y: y(host), width, height: rowH, class: "stripe" }));
        chart.append(svg("text", { x: left - 8, y: y(host) + rowH / 2 + 4, "text-anchor": "end", class: "host", "data-host": host },
          host, cameFor.has(host) ? svg("tspan", { class: "spare-of", text: ` ← ${cameFor.get(host)}` }) : null));
      });
      // where each attempt began
      const began = new Map();
      for (const s of spans) if (!began.has(s.attempt) || s.start < began.get(s.attempt)) began.set(s.attempt, s.start);
      for (const [attempt, t] of began) {
        chart.append(svg("line", { x1: x(t), x2: x(t), y1: 6, y2: height - bottom, class: "attempt-start" }),
          svg("text", { x: x(t) + 3, y: 14, class: "axis", text: `attempt ${attempt + 1}` }));
      }
      for (const s of spans) {
        const x0 = x(s.start), w = Math.max(x(s.end) - x0, 3), yy = y(s.host) + 3, h = rowH - 6;
        const code = s.exit_code === null || s.exit_code === undefined ? "" :
          s.exit_code < 0 ? ` (signal ${-s.exit_code})` : ` (exit ${s.exit_code})`;
        const how = s.state + code;
        const title = `attempt ${s.attempt + 1}, ${s.host}, node rank ${s.node_rank}: ${how}, ${span(s.end - s.start)}` +
          (s.took_place_of ? `; took ${s.took_place_of}'s place` : "") + (s.error ? `; ${s.error}` : "");
        const g = svg("g", { class: "span", "data-attempt": s.attempt, "data-host": s.host, "data-state": s.state,
          "data-spare-for": s.took_place_of },
          svg("title", { text: title }),
          svg("rect", { x: x0, y: yy, width: w, height: h, rx: 2, class: "span-bar state-" + s.state + (s.took_place_of ? " spare" : "") }));
        if (s.state === "failed" || s.state === "lost") {
          const cx = x0 + w, cy = yy + h / 2, r = Math.min(h / 2, 5);
          g.append(svg("path", { d: `M${cx - r},${cy - r}L${cx + r},${cy + r}M${cx - r},${cy + r}L${cx + r},${cy - r}`, class: "failure" }));
        }
        chart.append(g);
      }
      const legend = el("div", { class: "row muted legend" },
        ...["running", "succeeded", "failed", "killed", "lost"].map((st) => el("span", {}, el("span", { class: "swatch state-" + st }), " " + st)),
        el("span", {}, el("span", { class: "swatch spare" }), " on another host than the attempt before (a spare; ← whose place it took)"),
        el("span", {}, "✕ failed or lost"));
      box.replaceChildren(chart, legend);
    };
    // a running job's spans grow to now; what came since is asked every 10 s
    const timer = setInterval(() => {
      if (!data || ENDED.includes(data.state)) return;
      if (Date.now() - asked > 10000) fetchNow(); else draw();
    }, 2000);
    return { box, want, close() { clearInterval(timer); } };
  }

  function palette(i, n) {
    return `hsl(${Math.round((i * 360) / Math.max(n, 1) + 210) % 360}, 65%, 45%)`;
  }

  // ------------------------------------------------------------ the hosts

  function hostsPage() {
    const charts = el("div", { class: "panel" }, el("h2", {}, "The last hour"),
      el("div", { class: "muted" }, "the jobs' processes on each host (CPU of one core: 200% is two busy cores), and the host's GPUs; sampled while this page is open and kept in the jobs' records"));
    const cpuBox = el("div", { class: "chart", id: "chart-cpu" });
    const memBox = el("div", { class: "chart", id: "chart-mem" });
    const gpuBox = el("div", { class: "chart", id: "chart-gpu" });
    charts.append(el("h2", {}, "CPU %"), cpuBox, el("h2", {}, "memory"), memBox, el("h2", {}, "GPU use %"), gpuBox);
    const holders = el("div", { class: "panel", id: "cluster" }, el("h2", {}, "Who holds what"), el("div", { class: "muted" }, "asking the hosts…"));
    main.append(holders, charts);
    const made = {};
    const draw = (box, key, data, format) => {
      const hosts = Object.keys(data.hosts);
      const values = hosts.map((h) => data.hosts[h][key]);
      if (!values.some((v) => v.some((x) => x !== null))) {
        if (made[box.id]) { made[box.id].chart.destroy(); delete made[box.id]; }
        box.replaceChildren(el("div", { class: "muted" }, key === "gpu"
          ? "no GPU sampled: no nvidia-smi on these hosts, or no job running"
          : "no samples yet: they come every few seconds from running jobs"));
        return;
      }
      if (!made[box.id]) box.replaceChildren();
      const plotted = [data.time, ...values];
      const id = box.id + hosts.join(",");
      if (made[box.id] && made[box.id].id === id) { made[box.id].chart.setData(plotted); return; }
      if (made[box.id]) made[box.id].chart.destroy();
      const chart = new uPlot({
        width: Math.max(box.clientWidth - 10, 300), height: 200,
        // The samples' own span: one sample alone, a minute either side of it (uPlot pads
        // a single time by a tenth of its value: years). Points show while they are few.
        scales: { x: { time: true, range: (u, min, max) => {
          const xs = u.data[0];
          if (!xs || !xs.length) return [min, max];
          const lo = xs[0], hi = xs[xs.length - 1];
          return lo === hi ? [lo - 60, hi + 60] : [lo, hi];
        } } },
        series: [{}, ...hosts.map((h, i) => ({ label: h, stroke: palette(i, hosts.length), width: 1.5, spanGaps: false }))],
        axes: [{}, { size: 80, values: (u, ticks) => ticks.map(format) }],
        legend: { show: hosts.length <= 32 },
      }, plotted, box);
      made[box.id] = { id, chart };
    };
    const table = (title, heads, rows, id) => el("div", {}, el("h2", {}, title),
      rows.length ? el("div", { class: "scroll" }, el("table", { id },
        el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows))) : el("div", { class: "muted" }, "none"));
    const source = events("/api/hosts/events", {
      history: (data) => {
        draw(cpuBox, "cpu", data, percent);
        draw(memBox, "mem", data, (v) => (v === null ? "" : bytes(v)));
        draw(gpuBox, "gpu", data, percent);
      },
      cluster: (found) => {
        holders.replaceChildren(el("h2", {}, "Who holds what"), ...found.map((inv) => {
          if (inv.error) return el("div", { class: "message bad" }, `${inv.inventory}: ${inv.error}`);
          // each job's hosts, from the units it holds: on Slurm, the allocation's nodes
          const held = new Map();
          for (const u of inv.units) {
            if (!u.job) continue;
            const one = held.get(u.job) || { user: u.user || "", hosts: [], units: 0, kind: u.kind };
            if (!one.hosts.includes(u.host)) one.hosts.push(u.host);
            one.units += 1;
            held.set(u.job, one);
          }
          return el("div", { "data-inventory": inv.inventory },
            el("div", { class: "muted mono" }, inv.inventory),
            table("Jobs and the hosts they hold", ["job", "user", "hosts", "holds"], [...held].map(([job, h]) =>
              el("tr", { "data-job": job }, el("td", { class: "mono" }, job), el("td", {}, h.user),
                el("td", { class: "wrap", "data-hosts": h.hosts.join(",") }, `${h.hosts.length}: ${h.hosts.join(", ")}`),
                el("td", {}, `${h.units} ${h.kind}${h.units === 1 ? "" : "s"}`))), "holdings"),
            table("GPUs and slots", ["host", "kind", "unit", "state", "job", "user", "since"], inv.units.map((u) =>
              el("tr", {}, el("td", {}, u.host), el("td", {}, u.kind), el("td", {}, String(u.unit)),
                el("td", {}, stateBadge(u.state)), el("td", { class: "mono" }, u.job || (u.pid ? `pid ${u.pid}` : "")),
                el("td", {}, u.user || ""), el("td", {}, u.since ? span(Date.now() / 1000 - u.since) + " ago" : ""))), "units"),
            table("The waiting line", ["host", "place", "job", "user", "wants", "since"], inv.queue.map((q) =>
              el("tr", {}, el("td", {}, q.host), el("td", {}, String(q.position)), el("td", { class: "mono" }, q.job),
                el("td", {}, q.user), el("td", {}, `${q.count} ${q.kind}`), el("td", {}, q.since ? span(Date.now() / 1000 - q.since) + " ago" : ""))), "queue"),
            table("Warm interpreters", ["host", "pid", "state", "preload", "memory", "idle"], inv.warm.map((w) =>
              el("tr", {}, el("td", {}, w.host), el("td", {}, String(w.pid)), el("td", {}, w.state || ""),
                el("td", { class: "mono" }, (w.preload || []).join(", ")), el("td", {}, w.pss_kb ? bytes(w.pss_kb * 1024) : ""),
                el("td", {}, w.idle_s === undefined ? "" : span(w.idle_s)))), "warm"),
            table("Hosts that did not answer", ["host", "why"], inv.lost.map((l) =>
              el("tr", {}, el("td", {}, l.host || ""), el("td", { class: "wrap" }, stateBadge("lost"), " ", l.error))), "lost"));
        }));
      },
    });
    return { close() { source.close(); for (const m of Object.values(made)) m.chart.destroy(); } };
  }

  // ------------------------------------------------------------ two jobs side by side

  function comparePage(params) {
    const ids = (params.get("ids") || "").split(",").filter(Boolean);
    const panel = el("div", { class: "panel" }, el("h1", {}, "Compare"));
    main.append(panel);
    if (!ids.length) {
      panel.append(el("div", { class: "muted" }, "check two jobs or more on the jobs page, then “compare”"));
      return { close() {} };
    }
    const metric = el("select", { id: "compare-metric" });
    const box = el("div", { class: "chart", id: "compare-chart" });
    const info = el("div", { class: "muted", id: "compare-info" });
    const csv = el("a", { href: url("/api/curves.csv", { ids: ids.join(",") }), id: "compare-csv", download: "compared-curves.csv" },
      "these jobs' curves as CSV");
    panel.append(el("div", { class: "row" }, metric, info, csv), box);
    const per = new Map(ids.map((id) => [id, { next: 0, byName: new Map() }]));
    let chart = null, key = "";
    const fetchAll = async () => {
      for (const [id, job] of per) {
        const data = await getJSON("/api/job/" + encodeURIComponent(id) + "/curves", { from: job.next });
        if (data.error) { info.textContent = `${id}: ${data.error}`; continue; }
        job.next = data.next;
        for (const [, name, step, , value] of data.points) {
          if (!job.byName.has(name)) job.byName.set(name, new Map());
          const steps = job.byName.get(name);
          const cell = steps.get(step) || [0, 0];
          cell[0] += value; cell[1] += 1;
          steps.set(step, cell);
          if (![...metric.options].some((o) => o.value === name)) {
            metric.append(el("option", { value: name }, name));
            if (!metric.value || (name.includes("loss") && !metric.value.includes("loss"))) metric.value = name;
          }
        }
      }
      draw();
    };
    const draw = () => {
      const name = metric.value;
      const xs = new Set();
      for (const job of per.values()) for (const s of (job.byName.get(name) || new Map()).keys()) xs.add(s);
      const sorted = [...xs].sort((a, b) => a - b);
      const data = [sorted, ...[...per.values()].map((job) => {
        const steps = job.byName.get(name) || new Map();
        return sorted.map((x) => (steps.has(x) ? steps.get(x)[0] / steps.get(x)[1] : null));
      })];
      const k = name + ids.join(",");
      if (!chart || k !== key) {
        if (chart) chart.destroy();
        key = k;
        chart = new uPlot({
          width: Math.max(box.clientWidth - 10, 300), height: 320, scales: { x: { time: false } },
          series: [{ label: "step" }, ...ids.map((id, i) => ({ label: id, stroke: palette(i, ids.length), width: 1.5, spanGaps: true, points: { show: false } }))],
        }, data, box);
      } else chart.setData(data);
      // how many steps each job has drawn, in the order of `ids` (what a test reads)
      box.dataset.drawn = data.slice(1).map((ys) => ys.filter((v) => v !== null).length).join(",");
      box.dataset.metric = name || "";
      info.textContent = `${name || "no metric yet"}: the mean of each job's ranks, against step`;
    };
    metric.addEventListener("change", () => { key = ""; draw(); });
    fetchAll();
    const timer = setInterval(fetchAll, 3000);
    return { close() { clearInterval(timer); if (chart) chart.destroy(); } };
  }

  // ------------------------------------------------------------ start

  getJSON("/api/info").then((info) => { features = info.features || {}; }).finally(() => {
    window.addEventListener("hashchange", navigate);
    navigate();
  });
})();
