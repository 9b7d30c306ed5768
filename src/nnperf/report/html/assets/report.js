/* nnperf report script: a rich tooltip for roofline points and sortable tables.
   The page is complete without it (charts are inline SVG with native titles). It never builds
   HTML from data: every string goes in through textContent, so module names stay text. */
(function () {
  "use strict";
  var dataEl = document.getElementById("nnperf-data");
  if (!dataEl) return;
  var data = JSON.parse(dataEl.textContent);
  var root = document.querySelector(".nnperf");
  var tip = document.createElement("div");
  tip.className = "tip";
  tip.id = "nnperf-tip";
  root.appendChild(tip);

  function si(v, unit) {
    if (!v) return "0 " + unit;
    var p = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < p.length; i++) if (Math.abs(v) >= p[i][0]) return (v / p[i][0]).toPrecision(3) + " " + p[i][1] + unit;
    return v.toPrecision(3) + " " + unit;
  }
  function bytes(v) {
    var p = [[1099511627776, "TiB"], [1073741824, "GiB"], [1048576, "MiB"], [1024, "KiB"]];
    for (var i = 0; i < p.length; i++) if (Math.abs(v) >= p[i][0]) return (v / p[i][0]).toPrecision(3) + " " + p[i][1];
    return Math.round(v) + " B";
  }
  function secs(v) {
    if (v === null || v === undefined) return "not measured";
    if (v >= 1) return v.toPrecision(3) + " s";
    if (v >= 1e-3) return (v * 1e3).toPrecision(3) + " ms";
    if (v >= 1e-6) return (v * 1e6).toPrecision(3) + " \u00b5s";
    return (v * 1e9).toPrecision(3) + " ns";
  }

  function show(ev, run, p) {
    while (tip.firstChild) tip.removeChild(tip.firstChild);
    var b = document.createElement("b");
    b.textContent = p.label;
    tip.appendChild(b);
    var lines = [
      p.type + " \u00b7 " + p.ops + " ops, " + p.kernels + " kernels",
      "FLOPs: " + si(p.flops, "FLOP") + "   bytes: " + bytes(p.bytes),
      "intensity: " + p.intensity.toPrecision(3) + " FLOP/B",
      "predicted: " + secs(p.kernel_s) + " of kernels (" + si(p.achieved_flops, "FLOP/s") + ")" +
        (secs(p.time_s) !== secs(p.kernel_s) ? ", " + secs(p.time_s) + " of the step with the device's wait on the host" : ""),
      "measured: " + secs(p.measured_s),
      "bound: " + p.bound + "   GPU: " + run.gpu
    ];
    tip.appendChild(document.createTextNode(lines.join("\n")));
    tip.style.display = "block";
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + 430 > window.innerWidth) x = Math.max(0, ev.clientX - 430);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  document.querySelectorAll("svg.roofline").forEach(function (svg) {
    var run = data.runs[Number(svg.getAttribute("data-run"))];
    svg.querySelectorAll(".pt, .measured-pt").forEach(function (el) {
      var p = run.points[Number(el.getAttribute("data-i"))];
      var t = el.querySelector("title");
      if (t) { el.setAttribute("aria-label", t.textContent); el.removeChild(t); }
      el.addEventListener("mouseenter", function (ev) { show(ev, run, p); });
      el.addEventListener("mousemove", function (ev) { show(ev, run, p); });
      el.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    });
  });

  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.querySelectorAll("th");
    heads.forEach(function (th, col) {
      th.title = "sort";
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var dir = th.getAttribute("data-dir") === "desc" ? 1 : -1;
        heads.forEach(function (h) { h.removeAttribute("data-dir"); });
        th.setAttribute("data-dir", dir === 1 ? "asc" : "desc");
        rows.sort(function (a, b) {
          var x = a.cells[col], y = b.cells[col];
          var xs = x.getAttribute("data-v"), ys = y.getAttribute("data-v");
          if (xs !== null && ys !== null) return dir * (Number(xs) - Number(ys));
          return dir * x.textContent.localeCompare(y.textContent);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  root.setAttribute("data-ready", "1");
})();
