// The dashboard's script: reads `stats` next to the page once a second and
// draws the table, with one SVG chart per key. No other request is made.
"use strict";
(function () {
  // Works under any prefix, with or without a trailing slash.
  var path = location.pathname;
  var base = path.charAt(path.length - 1) === "/" ? path : path + "/";
  var rows = document.querySelector("#keys tbody");
  var status = document.getElementById("status");
  var summary = document.getElementById("summary");
  var W = 180, H = 34, SECONDS = 60;
  // Keys whose history (and chart) the page asks for: the busiest ones.
  var CHARTS = 100;

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function rate(n, windowMs) {
    var v = n * 1000 / windowMs;
    return v >= 100 ? v.toFixed(0) : v.toFixed(1);
  }

  function rt(us) {
    if (us === null || us === undefined) return "–";
    if (us >= 1000000) return (us / 1000000).toFixed(2) + " s";
    if (us >= 1000) return (us / 1000).toFixed(1) + " ms";
    return us + " µs";
  }

  // One polyline per series over the last minute: seconds without events
  // are zeros.
  function chart(k, nowMs, windowMs) {
    var h = k.history, last = nowMs - nowMs % 1000 - 1000;
    if (h === null) return '<span class="no-chart">–</span>';
    var pass = new Array(SECONDS).fill(0), block = new Array(SECONDS).fill(0);
    for (var i = 0; i < h.t.length; i++) {
      var slot = SECONDS - 1 - Math.round((last - h.t[i]) / 1000);
      if (slot >= 0 && slot < SECONDS) { pass[slot] = h.pass[i]; block[slot] = h.block[i]; }
    }
    var perSecondLimit = k.snapshot.limit * 1000 / windowMs;
    var top = Math.max(1, perSecondLimit, Math.max.apply(null, pass), Math.max.apply(null, block));
    function points(values) {
      var out = [];
      for (var i = 0; i < SECONDS; i++) {
        out.push((i * W / (SECONDS - 1)).toFixed(1) + "," + (H - 1 - values[i] * (H - 2) / top).toFixed(1));
      }
      return out.join(" ");
    }
    var y = (H - 1 - perSecondLimit * (H - 2) / top).toFixed(1);
    return '<svg width="' + W + '" height="' + H + '" viewBox="0 0 ' + W + " " + H + '" role="img">' +
      '<line class="limit" x1="0" x2="' + W + '" y1="' + y + '" y2="' + y + '"></line>' +
      '<polyline class="pass" points="' + points(pass) + '"></polyline>' +
      '<polyline class="block" points="' + points(block) + '"></polyline></svg>';
  }

  function name(k) {
    if (k.kind === "overflow") return '<i>keys without room</i><span class="tag">overflow</span>';
    if (k.kind === "missing") return '<i>no key</i><span class="tag">missing</span>';
    return esc(k.key);
  }

  function render(s) {
    var html = [];
    for (var i = 0; i < s.keys.length; i++) {
      var k = s.keys[i], snap = k.snapshot;
      html.push('<tr class="' + k.kind + '" data-key="' + esc(k.key === null ? "" : k.key) + '">' +
        '<td class="name">' + name(k) + "</td>" +
        '<td class="pass">' + rate(snap.pass, s.window_ms) + "</td>" +
        '<td class="block">' + rate(snap.block, s.window_ms) + "</td>" +
        '<td class="chart">' + chart(k, s.now_ms, s.window_ms) + "</td>" +
        '<td class="rt">' + rt(snap.avg_rt_us) + "</td>" +
        '<td class="concurrency">' + snap.concurrency + "</td>" +
        '<td class="limit">' + snap.limit + "</td></tr>");
    }
    rows.innerHTML = html.join("");
    var t = s.total;
    summary.innerHTML =
      '<div>keys<b id="total-keys">' + s.keys.length + "</b></div>" +
      '<div>pass/s<b id="total-pass">' + rate(t.pass, s.window_ms) + "</b></div>" +
      '<div>block/s<b id="total-block">' + rate(t.block, s.window_ms) + "</b></div>" +
      '<div>in flight<b id="total-concurrency">' + t.concurrency + "</b></div>" +
      '<div>avg RT<b id="total-rt">' + rt(t.avg_rt_us) + "</b></div>";
    if (s.limits_editable) showForm(s);
  }

  var form = document.getElementById("change");
  function showForm(s) {
    form.hidden = false;
    var list = [];
    for (var i = 0; i < s.keys.length && i < 200; i++) {
      if (s.keys[i].kind === "key") list.push('<option value="' + esc(s.keys[i].key) + '">');
    }
    document.getElementById("change-keys").innerHTML = list.join("");
  }
  form.addEventListener("submit", function (e) {
    e.preventDefault();
    var result = document.getElementById("change-result");
    var body = JSON.stringify({
      key: document.getElementById("change-key").value,
      limit: Number(document.getElementById("change-limit").value)
    });
    fetch(base + "limit", {
      method: "POST", body: body, credentials: "same-origin",
      headers: { "content-type": "application/json" }
    }).then(function (r) {
      result.textContent = r.ok ? "applied" : "refused (" + r.status + ")";
    }, function () { result.textContent = "failed"; });
  });

  var busy = false;
  function refresh() {
    if (busy) return;
    busy = true;
    fetch(base + "stats?history=" + CHARTS, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (s) {
        render(s);
        status.className = "status";
        status.textContent = "updated " + new Date(s.now_ms).toLocaleTimeString();
      })
      .catch(function (e) {
        status.className = "status error";
        status.textContent = "cannot read stats: " + e.message;
      })
      .then(function () { busy = false; });
  }
  refresh();
  setInterval(refresh, 1000);
})();
