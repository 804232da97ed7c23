// The dashboard's script: reads `stats` next to the page once a second and
// draws the table of the busiest keys (or of those the search box selects),
// with one SVG chart per key, and the table of the keys refused most over
// the last minute. No other request is made.
"use strict";
(function () {
  // Works under any prefix, with or without a trailing slash.
  var path = location.pathname;
  var base = path.charAt(path.length - 1) === "/" ? path : path + "/";
  var rows = document.querySelector("#keys tbody");
  var blockedRows = document.querySelector("#blocked tbody");
  var status = document.getElementById("status");
  var summary = document.getElementById("summary");
  var shown = document.getElementById("shown");
  var search = document.getElementById("search");
  var W = 180, H = 34, SECONDS = 60;
  // A search given in the page's own address (`?search=/api`) fills the box.
  var given = /(?:^\?|&)search=([^&]*)/.exec(location.search);
  if (given) {
    try { search.value = decodeURIComponent(given[1].replace(/\+/g, " ")); } catch (e) { /* kept empty */ }
  }

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
  function chart(h, limit, nowMs, windowMs) {
    var last = nowMs - nowMs % 1000 - 1000;
    if (!h) return '<span class="no-chart">–</span>';
    var pass = new Array(SECONDS).fill(0), block = new Array(SECONDS).fill(0);
    for (var i = 0; i < h.t.length; i++) {
      var slot = SECONDS - 1 - Math.round((last - h.t[i]) / 1000);
      if (slot >= 0 && slot < SECONDS) { pass[slot] = h.pass[i]; block[slot] = h.block[i]; }
    }
    var perSecondLimit = limit * 1000 / windowMs;
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

  // Where the Redis store decides now: "remote" or "fallback".
  function mode(store) { return String(store.mode).toLowerCase(); }

  // The worst state of a key's breakers; a dash when the layer has none.
  function breaker(state) {
    if (state === null || state === undefined) return "–";
    return '<span class="state ' + esc(state) + '">' + esc(state.replace("_", "-")) + "</span>";
  }

  // The keys are columns (see the module docs): row `i` of the table is
  // index `i` of every column.
  function kind(keys, i) {
    if (i === keys.overflow) return "overflow";
    if (i === keys.missing) return "missing";
    return "key";
  }

  function name(kind, key) {
    if (kind === "overflow") return '<i>keys without room</i><span class="tag">overflow</span>';
    if (kind === "missing") return '<i>no key</i><span class="tag">missing</span>';
    return esc(key);
  }

  // The keys refused most over the last minute (`top_blocked`, columns
  // like `keys`): a null key is the missing key. Labels are escaped as the
  // keys table's are, and cut short by the same style.
  function renderBlocked(b) {
    var html = [];
    for (var i = 0; i < b.key.length; i++) {
      var key = b.key[i], what = key === null ? "missing" : "key";
      html.push('<tr class="' + what + '" data-key="' + esc(key === null ? "" : key) + '">' +
        '<td class="name">' + name(what, key) + "</td>" +
        '<td class="blocks">' + b.block[i] + "</td></tr>");
    }
    blockedRows.innerHTML = html.length ? html.join("")
      : '<tr class="none"><td class="name" colspan="2">no client blocked in the last minute</td></tr>';
  }

  function render(s) {
    var k = s.keys, n = k.key.length, html = [];
    for (var i = 0; i < n; i++) {
      var what = kind(k, i), key = k.key[i];
      html.push('<tr class="' + what + '" data-key="' + esc(key === null ? "" : key) + '">' +
        '<td class="name">' + name(what, key) + "</td>" +
        '<td class="pass">' + rate(k.pass[i], s.window_ms) + "</td>" +
        '<td class="block">' + rate(k.block[i], s.window_ms) + "</td>" +
        '<td class="chart">' + chart(k.history[i], k.limit[i], s.now_ms, s.window_ms) + "</td>" +
        '<td class="rt">' + rt(k.avg_rt_us[i]) + "</td>" +
        '<td class="concurrency">' + k.concurrency[i] + "</td>" +
        '<td class="limit">' + k.limit[i] + "</td>" +
        '<td class="breaker">' + breaker(k.breaker[i]) + "</td></tr>");
    }
    rows.innerHTML = html.join("");
    renderBlocked(s.top_blocked);
    shown.textContent = s.search === null
      ? (n < s.keys_total ? "the " + n + " busiest of " + s.keys_total + " keys" : "")
      : s.matched + " of " + s.keys_total + " keys match \u201c" + s.search + "\u201d" +
        (n < s.matched ? ", the " + n + " busiest shown" : "");
    var t = s.total;
    summary.innerHTML =
      '<div>keys<b id="total-keys">' + s.keys_total + "</b></div>" +
      '<div>pass/s<b id="total-pass">' + rate(t.pass, s.window_ms) + "</b></div>" +
      '<div>block/s<b id="total-block">' + rate(t.block, s.window_ms) + "</b></div>" +
      '<div>in flight<b id="total-concurrency">' + t.concurrency + "</b></div>" +
      '<div>avg RT<b id="total-rt">' + rt(t.avg_rt_us) + "</b></div>" +
      (s.store ? '<div>store<b id="store" class="store ' + esc(mode(s.store)) + '">' + esc(mode(s.store)) +
        "</b><small>" + s.store.failures + " failed of " + s.store.round_trips + " round trips</small></div>" : "") +
      (s.rules.version || s.rules.last_error ? '<div>rules<b id="rules-version">v' + s.rules.version + "</b>" +
        (s.rules.last_error ? '<small id="rules-error" class="error">' + esc(s.rules.last_error) + "</small>" : "") +
        "</div>" : "") +
      (s.system ? systemBox(s.system) : "");
    if (s.limits_editable) showForm(s);
  }

  // The system rule (adaptive protection): CPU, in flight against BBR's
  // estimate, refusals since the layer was built.
  function systemBox(sys) {
    var refused = 0;
    for (var check in sys.refusals) refused += sys.refusals[check];
    return '<div>system<b id="system" class="' + (sys.bbr_active ? "bbr-on" : "bbr-off") + '">' +
      Math.round(sys.cpu * 100) + "% CPU</b><small>" + sys.in_flight + " in flight, BBR " +
      (sys.bbr_active ? "on at " : "off, estimate ") + sys.max_in_flight + "; " + refused +
      " refused</small></div>";
  }

  var form = document.getElementById("change");
  function showForm(s) {
    form.hidden = false;
    var list = [];
    var k = s.keys;
    for (var i = 0; i < k.key.length && i < 200; i++) {
      if (kind(k, i) === "key") list.push('<option value="' + esc(k.key[i]) + '">');
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

  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    var text = search.value.trim();
    var url = base + "stats" + (text ? "?search=" + encodeURIComponent(text) : "");
    fetch(url, { cache: "no-store", credentials: "same-origin" })
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
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }
  var typing = null;
  search.addEventListener("input", function () {
    clearTimeout(typing);
    typing = setTimeout(refresh, 250);
  });
  refresh();
  setInterval(refresh, 1000);
})();
