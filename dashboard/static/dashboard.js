// Live overview: poll the JSON endpoint and update text in place. Values are
// written with textContent, never innerHTML: identities come from clients.
(function () {
  "use strict";
  var root = document.getElementById("overview");
  if (!root) { return; }
  var api = root.dataset.api, chartUrl = root.dataset.chart, identityUrl = root.dataset.identity;

  function setText(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = String(value); }
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function renderTop(rows) {
    var body = document.getElementById("top");
    body.replaceChildren();
    if (!rows.length) {
      var empty = document.createElement("tr");
      cell(empty, "No traffic yet.").colSpan = 4;
      body.appendChild(empty);
      return;
    }
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      var link = document.createElement("a");
      link.href = identityUrl.replace("TAG", encodeURIComponent(r.tag));
      link.textContent = r.name;
      cell(tr, "").appendChild(link);
      cell(tr, r.plan);
      cell(tr, String(r.requests));
      cell(tr, r.closest ? r.closest.name + ": " + r.closest.remaining + "/" + r.closest.limit + " left" : "–");
      body.appendChild(tr);
    });
  }

  function renderTiers(tiers) {
    var body = document.getElementById("tiers");
    body.replaceChildren();
    Object.keys(tiers).forEach(function (name) {
      var tr = document.createElement("tr");
      cell(tr, name);
      cell(tr, String(tiers[name].allowed));
      cell(tr, String(tiers[name].denied));
      body.appendChild(tr);
    });
  }

  function storageText(s) {
    var text = s.backend + (s.up ? " · " + s.latency_ms + " ms" : " · DOWN");
    return s.degraded ? text + " · fail-" + s.fail_mode + " active" : text;
  }

  var busy = false;  // never stack polls behind a slow server

  function refresh() {
    if (busy) { return; }
    busy = true;
    fetch(api, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.json();
      })
      .then(function (data) {
        setText("allowed", data.allowed);
        setText("denied", data.denied);
        setText("deny-rate", data.deny_rate);
        setText("storage", storageText(data.storage));
        renderTiers(data.tiers);
        renderTop(data.top);
        document.getElementById("chart").src = chartUrl + "?t=" + Date.now();
        setText("updated", "Last update " + new Date().toLocaleTimeString() + ".");
      })
      .catch(function (error) { setText("updated", "Update failed: " + error.message); })
      .finally(function () { busy = false; });
  }

  // Usage is flushed about once a second; polling as often keeps a request's
  // appearance on this page within ~2 s (flush + poll), under the 3 s promised.
  window.setInterval(refresh, 1000);
})();
