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
        if (!r.ok) { throw new Error(path + ": " + r.status); }
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

  function Chart(el) {
    this.el = el;
    this.window = el.getAttribute("data-window") || "hour";
    this.plots = null;
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
  }

  Chart.prototype.size = function () {
    return { width: Math.max(280, Math.min(this.el.clientWidth || 600, 900)), height: 180 };
  };

  Chart.prototype.load = function () {
    var self = this;
    return getJSON("/stats", {
      window: this.window,
      queue: this.el.getAttribute("data-queue"),
      type: this.el.getAttribute("data-type")
    }).then(function (s) { self.draw(s); }).catch(function () { /* next poll */ });
  };

  Chart.prototype.draw = function (s) {
    var counts = [s.at, s.enqueued, s.completed, s.failed];
    var times = [s.at, s.wait_p50, s.wait_p95, s.run_p50, s.run_p95];
    var holder = this.el.querySelector(".plots");
    var total = this.el.querySelector("[data-chart-totals]");
    if (total) {
      setText(total, s.totals.enqueued + " enqueued, " + s.totals.completed + " completed, " +
        s.totals.failed + " failed in the last " + s.window +
        (s.sampled > 1 ? " (percentiles over 1 job in " + s.sampled + ")" : "") +
        (s.unread_minutes > 0 ? " (" + s.unread_minutes +
          " older minutes not counted: the rollup is behind)" : ""));
    }
    this.el.setAttribute("data-drawn", s.window);
    this.el.setAttribute("data-total-enqueued", String(s.totals.enqueued));
    if (this.plots && this.plots.window === s.window) {
      this.plots.counts.setData(counts);
      this.plots.times.setData(times);
      return;
    }
    if (this.plots) { this.plots.counts.destroy(); this.plots.times.destroy(); }
    holder.textContent = "";
    var size = this.size();
    var countSeries = [{}, { label: "enqueued", stroke: "#3b6ea5", width: 2 },
      { label: "completed", stroke: "#2e7d32", width: 2 },
      { label: "failed", stroke: "#c62828", width: 2 }];
    var timeSeries = [{}, { label: "wait p50 (s)", stroke: "#8e6c00" },
      { label: "wait p95 (s)", stroke: "#8e6c00", dash: [4, 4] },
      { label: "run p50 (s)", stroke: "#6a1b9a" },
      { label: "run p95 (s)", stroke: "#6a1b9a", dash: [4, 4] }];
    /* global uPlot */
    this.plots = {
      window: s.window,
      counts: new uPlot({ width: size.width, height: size.height, series: countSeries,
        scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } } },
        counts, holder),
      times: new uPlot({ width: size.width, height: size.height, series: timeSeries },
        times, holder)
    };
  };

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
