/* pgworker's dashboard, live: counts polled from <base>/live every
 * few seconds and charts from <base>/stats, drawn with uPlot (vendored, MIT). Polling stops
 * while the tab is hidden (document.visibilityState) and starts again when it is shown. Text
 * from the server is only ever set as textContent, never parsed as HTML. Every URL is built from
 * the data-base attribute of <body> (the dashboard may be mounted under a prefix). */
(function () {
  "use strict";
  var body = document.body;
  var base = body.getAttribute("data-base") || "";
  var COUNTS_EVERY = 5000;
  var CHART_EVERY = { hour: 30000, day: 300000 };
  var timers = [];
  var live = document.querySelector("[data-live-total], [data-live-queue], [data-live-workers]");

  function getJSON(path, params) {
    var query = new URLSearchParams();
    Object.keys(params || {}).forEach(function (k) {
      if (params[k]) { query.set(k, params[k]); }
    });
    var url = base + path + (query.toString() ? "?" + query.toString() : "");
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) {
          return r.json().catch(function () { return null; }).then(function (body) {
            var error = new Error(path + ": " + r.status);
            error.body = body;
            throw error;
          });
        }
        return r.json();
      });
  }

  function setText(el, value) {
    var text = String(value);
    if (el.textContent !== text) { el.textContent = text; }
  }

  /* obj[key] when obj has it as its own: a queue may be named constructor or toString, which
   * every object inherits. */
  function own(obj, key) {
    return obj && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : undefined;
  }

  function showCounts(data) {
    document.querySelectorAll("[data-live-total]").forEach(function (el) {
      var n = own(data.totals, el.getAttribute("data-live-total"));
      if (n !== undefined) { setText(el, n); }
    });
    document.querySelectorAll("[data-live-queue]").forEach(function (el) {
      var name = el.getAttribute("data-live-queue");
      var counts = own(data.queues, name);
      var status = el.getAttribute("data-live-status");
      if (counts === undefined && data.truncated) { return; } /* left out: keep what is shown */
      if (status) {
        setText(el, counts ? (own(counts, status) || 0) : 0);
      } else if (el.hasAttribute("data-live-oldest")) {
        setText(el, own(data.oldest, name) || "-");
      }
    });
    document.querySelectorAll("[data-live-workers]").forEach(function (el) {
      setText(el, data.workers);
    });
    body.setAttribute("data-live-at", String(Date.now()));
  }

  function pollCounts() {
    getJSON("/live").then(showCounts).catch(function () { /* next poll tries again */ });
  }

  var charts = [];

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  /* A duration in seconds, in the unit of its size: 850 µs, 42 ms, 3.5 s, 12 min, 2.1 h. */
  function duration(v) {
    if (v === null || v === undefined) { return "–"; }
    function short(x) { return String(Number(x.toPrecision(3))); }
    if (v < 0.001) { return short(v * 1e6) + " µs"; }
    if (v < 1) { return short(v * 1000) + " ms"; }
    if (v < 120) { return short(v) + " s"; }
    if (v < 7200) { return short(v / 60) + " min"; }
    return short(v / 3600) + " h";
  }

  /* The steps of the counts' axis: whole numbers (no 0.2 job). */
  var WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5,
    1e6, 2e6, 5e6, 1e7];

  function Chart(el) {
    this.el = el;
    this.window = el.getAttribute("data-window") || "hour";
    this.plots = null;
    this.last = null;
    var self = this;
    el.querySelectorAll("button[data-window]").forEach(function (b) {
      b.addEventListener("click", function () {
        self.window = b.getAttribute("data-window");
        el.querySelectorAll("button[data-window]").forEach(function (o) {
          o.setAttribute("aria-pressed", String(o === b));
        });
        self.load();
        schedule();
      });
    });
    /* The fields narrow the chart to one queue or type (as the queue's page does). */
    el.querySelectorAll("input[data-chart-filter]").forEach(function (input) {
      input.addEventListener("change", function () {
        var name = "data-" + input.getAttribute("data-chart-filter");
        var value = input.value.trim();
        if (value) { el.setAttribute(name, value); } else { el.removeAttribute(name); }
        self.load();
      });
    });
  }

  Chart.prototype.load = function () {
    var self = this;
    var total = this.el.querySelector("[data-chart-totals]");
    return getJSON("/stats", {
      window: this.window,
      queue: this.el.getAttribute("data-queue"),
      type: this.el.getAttribute("data-type")
    }).then(function (s) { self.draw(s); }).catch(function (error) {
      /* a field refused (422) says why; anything else: the next poll tries again */
      if (total && error.body && error.body.error) { setText(total, error.body.error); }
    });
  };

  Chart.prototype.draw = function (s) {
    var total = this.el.querySelector("[data-chart-totals]");
    var per = s.window === "hour" ? "minute" : "10 minutes";
    if (total) {
      /* Attempts, not jobs: a job retried twice counts two failed attempts here, while the
       * "need attention" card counts jobs that failed for good. */
      setText(total, s.totals.enqueued + " jobs enqueued · " + s.totals.completed +
        " attempts completed · " + s.totals.failed + " failed attempts (retries included)" +
        " in the last " + s.window +
        (s.unread_minutes > 0 ? " (" + s.unread_minutes +
          " older minutes not counted: the rollup is behind)" : ""));
    }
    var measured = s.wait_p50.concat(s.wait_p95, s.run_p50, s.run_p95).some(function (v) {
      return v !== null && v > 0;
    });
    var counts = [s.at, s.enqueued, s.completed, s.failed];
    var times = [s.at, s.wait_p50, s.wait_p95, s.run_p50, s.run_p95];
    this.last = s;
    if (this.plots && this.plots.window === s.window && this.plots.log === measured) {
      this.plots.counts.setData(counts);
      this.plots.times.setData(times);
    } else {
      this.build(s, per, measured, counts, times);
    }
    this.el.setAttribute("data-drawn", s.window);
    this.el.setAttribute("data-total-enqueued", String(s.totals.enqueued));
  };

  /* Two plots, each the section's full width: the counts, and the wait and run times on a
   * logarithmic scale (a p95 a hundred times the p50 leaves the p50 visible). Colours come from
   * the stylesheet's variables, read again at each build (a change of theme rebuilds). Points
   * are drawn on the times: a bucket measured between two empty ones has no line to draw. */
  Chart.prototype.build = function (s, per, measured, counts, times) {
    var holder = this.el.querySelector(".plots");
    if (this.plots) { this.plots.counts.destroy(); this.plots.times.destroy(); }
    holder.textContent = "";
    var muted = cssVar("--muted");
    var grid = cssVar("--chart-grid");
    var narrow = holder.clientWidth < 600;
    function box(title) {
      var div = document.createElement("div");
      div.className = "plot";
      var h = document.createElement("h3");
      h.textContent = title;
      div.appendChild(h);
      var area = document.createElement("div");
      div.appendChild(area);
      holder.appendChild(div);
      return area;
    }
    function axes(values) {
      var y = { stroke: muted, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 },
        size: narrow ? 58 : 66, font: (narrow ? "11px" : "12px") + " system-ui, sans-serif" };
      if (values) { y.values = values; } else { y.incrs = WHOLE; }
      return [{ stroke: muted, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 },
        font: y.font }, y];
    }
    function line(label, color, dash) {
      var series = { label: label, stroke: color, width: 2, spanGaps: false };
      if (dash) { series.dash = [5, 4]; }
      return series;
    }
    function timed(label, color, dash) {
      var series = line(label, color, dash);
      series.points = { show: true, size: narrow ? 4 : 5, fill: color, stroke: color };
      series.value = function (u, v) { return duration(v); };
      return series;
    }
    var countArea = box("Jobs enqueued, attempts completed and failed, per " + per);
    var timeArea = box("Wait and run time per " + per + ": p50 solid, p95 dashed");
    var size = { width: Math.max(240, countArea.clientWidth), height: narrow ? 170 : 220 };
    var wait = cssVar("--chart-wait");
    var run = cssVar("--chart-run");
    /* global uPlot */
    this.plots = {
      window: s.window,
      log: measured,
      counts: new uPlot({
        width: size.width, height: size.height, axes: axes(null),
        series: [{}, line("enqueued", cssVar("--chart-enqueued")),
          line("completed", cssVar("--chart-completed")),
          line("failed attempts", cssVar("--chart-failed"))],
        scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } }
      }, counts, countArea),
      times: new uPlot({
        width: size.width, height: size.height,
        axes: axes(function (u, splits) { return splits.map(duration); }),
        series: [{}, timed("wait p50", wait), timed("wait p95", wait, true),
          timed("run p50", run), timed("run p95", run, true)],
        scales: measured ? { y: { distr: 3, log: 10 } }
          : { y: { range: function () { return [0, 1]; } } }
      }, times, timeArea)
    };
  };

  Chart.prototype.resize = function () {
    if (!this.plots) { return; }
    var area = this.plots.counts.root.parentNode;
    var size = { width: Math.max(240, area.clientWidth), height: this.plots.counts.height };
    this.plots.counts.setSize(size);
    this.plots.times.setSize(size);
  };

  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () { charts.forEach(function (c) { c.resize(); }); }, 150);
  });
  /* theme.js says when the colours changed: rebuild with the new ones. */
  document.addEventListener("pgworker:theme", function () {
    charts.forEach(function (c) { if (c.plots && c.last) { c.plots.window = null; c.draw(c.last); } });
  });

  function visible() { return document.visibilityState !== "hidden"; }

  function schedule() {
    timers.forEach(clearInterval);
    timers = [];
    if (!visible()) { return; }
    if (live) { timers.push(setInterval(pollCounts, COUNTS_EVERY)); }
    charts.forEach(function (c) {
      timers.push(setInterval(function () { c.load(); }, CHART_EVERY[c.window] || 30000));
    });
  }

  document.addEventListener("visibilitychange", function () {
    if (visible()) {
      if (live) { pollCounts(); }
      charts.forEach(function (c) { c.load(); });
    }
    schedule();
  });

  document.querySelectorAll("[data-chart]").forEach(function (el) {
    var chart = new Chart(el);
    charts.push(chart);
    chart.load();
  });
  schedule();
})();
