/* outrig report: draws the document in #outrig-data with uPlot (inlined above).
   Every text from the run reaches the page through textContent, never as markup.
   window.outrigReport says what was drawn: each chart's series and points, the events,
   and any error (the browser test reads it). */
(function () {
  "use strict";
  var state = {charts: [], events: 0, errors: [], done: false, timed: null};
  window.outrigReport = state;
  window.addEventListener("error", function (e) { state.errors.push(String(e.message)); });

  var doc = JSON.parse(document.getElementById("outrig-data").textContent);
  var main = document.getElementById("report");
  var PALETTE = ["#1f6fb4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                 "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"];
  var TIME_LABEL = "time since the first deploy";
  var MARKS = {deploy: "#666", ready: "#2ca02c", checkpoint: "#1f6fb4", resume: "#9467bd",
               resumed: "#9467bd", migrate: "#d62728", migrating: "#d62728",
               suspect: "#ff7f0e", dead: "#d62728", failed: "#d62728", evaluate: "#17becf",
               fenced: "#8c564b", interrupt: "#ff7f0e", finished: "#2ca02c"};

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  function add(parent, tag, text, cls) { return parent.appendChild(el(tag, text, cls)); }
  /* hours since the start as h:mm (seconds: h:mm:ss, or m:ss under an hour) */
  function hm(h, seconds) {
    if (h === null || h === undefined) return "";
    var sign = h < 0 ? "-" : "", s = Math.round(Math.abs(h) * 3600);
    var hh = Math.floor(s / 3600), mm = String(Math.floor(s / 60) % 60).padStart(2, "0");
    var ss = String(s % 60).padStart(2, "0");
    if (!seconds) return sign + hh + ":" + mm;
    return sign + (hh ? hh + ":" + mm : String(Math.floor(s / 60))) + ":" + ss;
  }
  function num(v) {
    if (v === null || v === undefined) return "";
    var a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(2) : String(+v.toPrecision(4));
  }
  function table(parent, head, rows) {
    var t = add(parent, "table"), tr = add(add(t, "thead"), "tr"), body = add(t, "tbody");
    head.forEach(function (h) { add(tr, "th", h); });
    rows.forEach(function (row) {
      var r = add(body, "tr");
      row.forEach(function (cell) {
        if (cell instanceof Node) add(r, "td").appendChild(cell); else add(r, "td", cell);
      });
    });
    return t;
  }

  /* one chart: tables [[xs, ys], ...] aligned by uPlot.join; markers: x of events */
  function chart(parent, spec) {
    var box = add(parent, "div", null, "chart");
    var entry = {id: spec.id, kind: spec.kind, title: spec.title, metrics: spec.metrics || [],
                 series: spec.tables.length, points: 0, drawn: false, log: !!spec.log};
    state.charts.push(entry);
    if (!spec.tables.length) { add(box, "p", spec.title + ": no values", "empty"); return; }
    var data = uPlot.join(spec.tables);
    var width = Math.max(360, Math.min(600, Math.floor((main.clientWidth - 110) / 2)));
    var series = [{label: spec.xlabel, value: function (u, v) {
      return spec.kind === "time" ? hm(v, true) : (v === null ? "" : String(v)); }}];
    spec.labels.forEach(function (label, i) {
      series.push({label: label, stroke: spec.colours[i], width: 1.5, spanGaps: true,
                   dash: (spec.dashes || [])[i] || undefined,
                   points: {show: spec.kind === "evaluation"},
                   value: function (u, v) { return num(v); }});
    });
    var xaxis = {label: spec.xlabel, space: 70};
    if (spec.kind === "time") {
      xaxis.values = function (u, splits) {
        var span = u.scales.x.max - u.scales.x.min;  /* under 2 hours: to the second */
        return splits.map(function (v) { return hm(v, span < 2); });
      };
    }
    var scales = {x: {time: false}};
    if (spec.log) scales.y = {distr: 3};  /* log10: outrig report --log */
    var opts = {
      title: spec.title + (spec.log ? " (log scale)" : ""), width: width, height: 230,
      scales: scales,
      series: series, axes: [xaxis, {size: 56, values: function (u, s) { return s.map(num); }}],
      legend: {live: true},
      hooks: {draw: [function (u) {
        var count = 0, xmin = u.scales.x.min, xmax = u.scales.x.max;
        for (var i = 1; i < u.data.length; i++) {
          for (var j = 0; j < u.data[0].length; j++) {
            var x = u.data[0][j], y = u.data[i][j];
            if (y !== null && y !== undefined && x >= xmin && x <= xmax) count++;
          }
        }
        entry.points = count;
        entry.drawn = true;
        (spec.markers || []).forEach(function (m) {
          if (m.x < xmin || m.x > xmax) return;
          var px = u.valToPos(m.x, "x", true);
          u.ctx.save();
          u.ctx.strokeStyle = MARKS[m.kind] || "#999";
          u.ctx.setLineDash([4, 4]);
          u.ctx.lineWidth = 1;
          u.ctx.beginPath();
          u.ctx.moveTo(px, u.bbox.top);
          u.ctx.lineTo(px, u.bbox.top + u.bbox.height);
          u.ctx.stroke();
          u.ctx.restore();
        });
      }]}
    };
    new uPlot(opts, data, box);
    if (spec.note) add(box, "p", spec.note, "meta");  /* values no chart can draw */
  }

  function sorted(xs, ys) {
    var pairs = [];
    for (var i = 0; i < xs.length; i++) {
      if (xs[i] !== null && xs[i] !== undefined) pairs.push([xs[i], ys[i]]);
    }
    pairs.sort(function (a, b) { return a[0] - b[0]; });
    return [pairs.map(function (p) { return p[0]; }), pairs.map(function (p) { return p[1]; })];
  }

  /* --- the page ------------------------------------------------------------------- */
  add(main, "h1", doc.title);
  add(main, "p", "generated " + doc.generated + " by outrig from its journal and log mirror",
      "meta");

  var runs = add(main, "section");
  add(runs, "h2", "Runs");
  doc.runs.forEach(function (run, index) {
    var card = add(runs, "div", null, "run");
    var head = add(card, "h3");
    var chip = add(head, "span", "", "chip");
    chip.style.background = PALETTE[index % PALETTE.length];
    head.appendChild(document.createTextNode(run.label));
    var facts = [["playbook", run.playbook], ["host", run.host], ["state", run.status],
                 ["deployed", run.created ? new Date(run.created * 1000).toISOString()
                  .replace("T", " ").slice(0, 19) + " UTC" : ""],
                 ["GPUs", (run.gpus_used.length ? run.gpus_used.join(",") : "none planned") +
                  (run.gpu_count ? " of " + run.gpu_count : "") +
                  (run.gpu_memory_mib ? " (" + run.gpu_memory_mib + " MiB each)" : "")],
                 ["metric records", run.points + " (one per step and process)"]];
    if (run.migrated_from && run.migrated_from.run_id) {
      facts.push(["migrated from", run.migrated_from.run_id + " on " + run.migrated_from.host]);
    }
    if (run.moved_to && run.moved_to.run_id) {
      facts.push(["moved to", run.moved_to.run_id + " on " + run.moved_to.host]);
    }
    if (run.cost && run.cost.usd !== undefined) {  /* a box rented through outrig */
      facts.push(["cost", "$" + Number(run.cost.usd).toFixed(run.cost.usd < 0.01 ? 4 : 2) +
                  " (" + run.cost.provider + " at $" +
                  Number(run.cost.price_per_hour || 0).toFixed(2) + "/h)"]);
    }
    if (run.mirror) facts.push(["log mirror", run.mirror]);
    var dl = add(card, "dl");
    facts.forEach(function (f) { add(dl, "dt", f[0]); add(dl, "dd", f[1]); });
    if (run.processes.length) {  /* long: folded, one line says what is inside */
      var fold = add(card, "details");
      add(fold, "summary", "commands: " + run.processes.map(function (p) {
        return p.name + (p.gpus.length ? " (GPU " + p.gpus.join(",") + ")" : "");
      }).join(", "));
      table(fold, ["process", "GPUs", "command"], run.processes.map(function (p) {
        return [p.name, p.gpus.join(",") || "-", el("code", p.command)];
      }));
    }
  });

  function runColour(runId) {
    for (var i = 0; i < doc.runs.length; i++) {
      if (doc.runs[i].run_id === runId) return PALETTE[i % PALETTE.length];
    }
    return "#333";
  }
  var markers = doc.events.filter(function (e) { return e.x !== null; })
    .map(function (e) { return {x: e.x, kind: e.kind}; });

  var curves = add(main, "section");
  add(curves, "h2", "Metrics");
  add(curves, "p", "Left: over the training step (runs aligned by step). Right: over the " +
      "time since the first deploy of each run's chain, h:mm (a migrated run goes on in " +
      "its successor); dashed lines mark the events of the timeline below.", "meta");
  if (!doc.charts.length) add(curves, "p", "No metric lines in the log mirror yet.", "empty");
  /* a trainer that prints no times: no "over time" panel could hold a value; half a row of
     "no values" beside each chart said so once per metric. One line says it instead. */
  var timed = doc.runs.some(function (run) {
    var per = doc.series[run.run_id] || {};
    return Object.keys(per).some(function (m) {
      return per[m].t.some(function (x) { return x !== null && x !== undefined; });
    });
  });
  if (doc.charts.length && !timed) {
    add(curves, "p", "Over time: not drawn. No metric line of " +
        (doc.runs.length > 1 ? "these runs" : "this run") + " carries a time (its trainer " +
        "prints none), so each metric is drawn over the step only.", "meta");
  }
  state.timed = timed;
  doc.charts.forEach(function (c) {
    var row = add(curves, "div", null, "pair");
    (timed ? ["step", "time"] : ["step"]).forEach(function (kind) {
      var tables = [], labels = [], colours = [], dashes = [];
      doc.runs.forEach(function (run, ri) {
        c.metrics.forEach(function (metric, mi) {
          var s = doc.series[run.run_id] && doc.series[run.run_id][metric];
          if (!s || !s.v.length) return;
          var xy = kind === "step" ? [s.s, s.v] : sorted(s.t, s.v);
          if (!xy[0].length) return;
          if (doc.log_scale) {  /* a log axis cannot place 0 or below: left out, noted */
            xy = [xy[0], xy[1].map(function (v) { return v > 0 ? v : null; })];
          }
          tables.push(xy);
          labels.push((doc.runs.length > 1 ? run.run_id + " " : "") + metric);
          /* one metric: a colour per run; a family: a colour per metric, a dash per run */
          colours.push(PALETTE[(c.metrics.length > 1 ? mi : ri) % PALETTE.length]);
          dashes.push(c.metrics.length > 1 && ri > 0 ? [2 + 4 * ri, 3] : null);
        });
      });
      chart(row, {id: c.id + "-" + kind, kind: kind, title: c.title, metrics: c.metrics,
                  xlabel: kind === "step" ? "step" : TIME_LABEL, tables: tables, labels: labels,
                  colours: colours, dashes: dashes, markers: kind === "time" ? markers : [],
                  log: !!doc.log_scale,
                  note: kind === "step" ? c.note : null});
    });
  });

  var gpus = add(main, "section");
  add(gpus, "h2", "GPUs");
  var memory = [], util = [], gl = [], gc = [];
  doc.runs.forEach(function (run) {
    var per = doc.gpu[run.run_id] || {};
    Object.keys(per).sort().forEach(function (index, k) {
      var g = per[index];
      memory.push(sorted(g.t, g.used));
      util.push(sorted(g.t, g.util));
      gl.push((doc.runs.length > 1 ? run.run_id + " " : "") + "GPU " + index);
      gc.push(PALETTE[(k + doc.runs.indexOf(run)) % PALETTE.length]);
    });
  });
  if (!memory.length) {
    add(gpus, "p", "No GPU samples: status and watch record them while the run is running.",
        "empty");
  } else {
    var pair = add(gpus, "div", null, "pair");
    chart(pair, {id: "gpu-memory", kind: "time", title: "GPU memory used (MiB)",
                 xlabel: TIME_LABEL, tables: memory, labels: gl, colours: gc, markers: markers});
    chart(pair, {id: "gpu-util", kind: "time", title: "GPU utilisation (%)", xlabel: TIME_LABEL,
                 tables: util, labels: gl, colours: gc, markers: markers});
  }

  if (doc.evaluations.length) {
    var ev = add(main, "section");
    add(ev, "h2", "Evaluations on vLLM (outrig evaluate)");
    var et = [], el2 = [], ec = [];
    doc.evaluations.forEach(function (e, i) {
      et.push([e.per_position.map(function (_, k) { return k + 1; }), e.per_position]);
      el2.push(e.label + " (" + e.at + ")");
      ec.push(PALETTE[i % PALETTE.length]);
    });
    chart(add(ev, "div", null, "pair"), {id: "evaluation", kind: "evaluation",
          title: "acceptance per position", xlabel: "position", tables: et, labels: el2,
          colours: ec});
  }

  var tl = add(main, "section");
  add(tl, "h2", "Timeline");
  if (!doc.events.length) add(tl, "p", "No events recorded.", "empty");
  else {
    table(tl, ["when", "since start", "run", "event", "step", "detail"],
          doc.events.map(function (e) {
            var kind = el("span", e.kind, "kind");
            kind.style.borderColor = MARKS[e.kind] || "#999";
            var run = el("span", e.run_id);
            run.style.color = runColour(e.run_id);
            return [e.when, hm(e.x, true), run, kind, e.step === null ? "" : e.step, e.text];
          }));
    state.events = doc.events.length;
  }
  state.done = true;
}());
