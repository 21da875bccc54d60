// Live overview: poll the JSON endpoint and update text in place. Values are
// written with textContent, never innerHTML: identities come from clients.
(function () {
  "use strict";
  var root = document.getElementById("overview");
  if (!root) { return; }
  var api = root.dataset.api, chartUrl = root.dataset.chart, identityUrl = root.dataset.identity;
  var KINDS = { ip: "IP", client: "client", user: "user" };

  function setText(id, value) {
    var el = document.getElementById(id);
    // null: unknown (the storage is down), which is not zero
    if (el) { el.textContent = value === null ? "–" : String(value); }
  }

  function show(id, visible) {
    var el = document.getElementById(id);
    if (el) { el.hidden = !visible; }
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function identityCell(tr, r) {
    var td = cell(tr, "");
    // The kind is a badge apart from the name: an identity called "IP 6.6.6.6" is not that IP.
    var kind = document.createElement("span");
    kind.className = "kind kind-" + r.kind;
    kind.textContent = KINDS[r.kind] || r.kind;
    var link = document.createElement("a");
    link.href = identityUrl.replace("TAG", encodeURIComponent(r.tag));
    link.textContent = r.name;
    td.append(kind, " ", link);
  }

  function emptyRow(body, columns, text) {
    var tr = document.createElement("tr");
    cell(tr, text).colSpan = columns;
    body.appendChild(tr);
  }

  var DOWN = "Unknown while the storage is down.";

  function renderTop(rows, usage) {
    var body = document.getElementById("top");
    body.replaceChildren();
    if (!rows.length) {
      emptyRow(body, 4, usage === "unavailable" ? DOWN : "No traffic yet.");
      return;
    }
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      identityCell(tr, r);
      cell(tr, r.plan);
      cell(tr, String(r.requests));
      cell(tr, r.closest ? r.closest.name + ": " + r.closest.remaining + "/" + r.closest.limit + " " + r.closest.unit + " left" : "–");
      body.appendChild(tr);
    });
  }

  function renderNear(rows, usage) {
    var body = document.getElementById("near-limit");
    body.replaceChildren();
    if (!rows.length) {
      var none = "Nobody is at " + body.dataset.percent + "% of a limit or above.";
      emptyRow(body, 5, usage === "unavailable" ? DOWN : none);
      return;
    }
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      identityCell(tr, r);
      cell(tr, r.plan);
      cell(tr, r.bucket === r.tier ? r.tier : r.tier + ": " + r.bucket);
      cell(tr, r.remaining + "/" + r.limit + " " + r.unit);
      cell(tr, r.used_percent + "%");
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
      cell(tr, String(tiers[name].shadow_denied));  // shadow tiers: would have denied
      body.appendChild(tr);
    });
  }

  function storageText(s) {
    var text = s.backend + " · " + s.status + (s.up ? " · " + s.latency_ms + " ms" : "");
    if (s.fail_mode_active) { text += " · fail mode " + s.fail_mode + " active"; }
    return s.breaker_open ? text + " · breaker open" : text;
  }

  function renderOutage(s) {  // the banner of base.html, kept current
    setText("outage-backend", s.backend);
    setText("outage-status", s.status);
    setText("outage-error", s.error ? " (" + s.error + ")" : "");
    setText("outage-mode", s.fail_mode);
    setText("outage-effect", s.fail_mode_effect);
    setText("outage-probe", s.probe_every_text);
    show("outage-breaker", s.breaker_open);
    show("outage", s.fail_mode_active);
  }

  var busy = false;  // never stack polls behind a slow server

  function renderOverload(o) {  // requests in flight by class, the capacity, sheds
    var body = document.getElementById("in-flight");
    if (!body || !o || o.unavailable) { return; }
    var capacity = [];
    if (o.capacity !== null) { capacity.push(o.capacity + " (fleet)"); }
    if (o.adaptive !== null) { capacity.push(o.adaptive + " (this worker, adaptive)"); }
    setText("capacity", capacity.length ? capacity.join(" · ") : "–");
    setText("sheds", o.sheds_per_minute);
    while (body.firstChild) { body.removeChild(body.firstChild); }
    ["critical", "default", "sheddable"].forEach(function (cls) {
      var tr = document.createElement("tr");
      cell(tr, cls);
      cell(tr, o.in_flight[cls]);
      cell(tr, o.lines ? o.lines[cls] : "–");
      body.appendChild(tr);
    });
  }

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
        renderOutage(data.storage);
        show("usage-unavailable", data.usage === "unavailable");
        renderTiers(data.tiers);
        renderTop(data.top, data.usage);
        renderNear(data.near_limit, data.usage);
        renderOverload(data.overload);
        document.getElementById("chart").src = chartUrl + "?t=" + Date.now();
        setText("updated", "Last update " + new Date().toLocaleTimeString() + ".");
      })
      .catch(function (error) { setText("updated", "Update failed: " + error.message); })
      .finally(function () { busy = false; });
  }

  // Usage is flushed at once after a quiet second, and at most once a second under
  // traffic; polling as often shows a request here within ~1-2 s (under the 3 s promised).
  window.setInterval(refresh, 1000);
})();
