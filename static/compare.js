// The comparison picker: any two models side by side, offline and from file://. Each model's numbers come from
// data/<slug>.js, written by the build (explorer/compare_views.py), loaded by a script tag on first use; this
// script only subtracts them, as BigInts (counts are exact integers, some past 2^53), and lays out the tables
// the static comparison pages have. Without JavaScript the page lists the static comparisons.
(function () {
  "use strict";
  var form = document.getElementById("compare-picker");
  var out = document.getElementById("compare-result");
  if (!form || !out) return;
  var base = form.getAttribute("data-data");
  var pick = { a: form.elements.a, b: form.elements.b };
  window.EXPLORER_COMPARE = window.EXPLORER_COMPARE || {};

  function load(slug, then) {
    if (window.EXPLORER_COMPARE[slug]) return then();
    var s = document.createElement("script");
    s.src = base + encodeURIComponent(slug) + ".js";
    s.onload = then;
    document.head.appendChild(s);
  }

  function grouped(digits) { return digits.replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function fmt(n) { return (n < 0n ? "−" : "") + grouped((n < 0n ? -n : n).toString()); }
  function signed(n) { return n > 0n ? "+" + fmt(n) : fmt(n); }
  // As explorer/calculator.py's size and compare_views.py's sized: bytes also in decimal units (kB, MB, GB).
  var UNITS = ["bytes", "kB", "MB", "GB", "TB", "PB"];
  function size(n) {
    if (n < 0n) return "−" + size(-n);
    var p = 0, scale = 1n;
    while (p + 1 < UNITS.length && n >= scale * 1000n) { p += 1; scale *= 1000n; }
    if (p === 0) return fmt(n) + " bytes";
    var h = n * 100n / scale;
    return fmt(h / 100n) + "." + (h % 100n).toString().padStart(2, "0") + " " + UNITS[p];
  }
  function sized(n, sign) {
    var exact = sign ? signed(n) : fmt(n);
    return n === 0n ? exact : exact + " (" + (sign && n > 0n ? "+" : "") + size(n) + ")";
  }

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) { e.append(c); });
    return e;
  }
  function link(model) { return el("a", { href: model.href }, [model.name]); }

  function table(caption, head, rows, foot) {
    var t = el("table", { "class": "compare" }, [el("caption", {}, [caption])]);
    t.append(el("thead", {}, [el("tr", {}, head.map(function (h, i) {
      return el("th", { scope: "col", "class": i ? "num" : "" }, [h]);
    }))]));
    var body = el("tbody");
    rows.forEach(function (r) { body.append(row(r, head)); });
    t.append(body);
    if (foot) t.append(el("tfoot", {}, [row(foot, head)]));
    return el("div", { "class": "table-wrap" }, [t]);
  }
  function row(r, head) {  // r: [label, left, right, counts bytes]
    var left = BigInt(r[1]), right = BigInt(r[2]), b = r[3];
    return el("tr", {}, [el("th", { scope: "row" }, [r[0]]),
      el("td", { "class": "num", "data-label": head[1] }, [b ? sized(left) : fmt(left)]),
      el("td", { "class": "num", "data-label": head[2] }, [b ? sized(right) : fmt(right)]),
      el("td", { "class": "num", "data-label": "Δ" }, [b ? sized(right - left, true) : signed(right - left)])]);
  }

  // A role named with each side's mechanisms where they differ, as explorer/compare_views.py names it.
  function label(role, L, R) {
    var a = L.mechanisms[role], b = R.mechanisms[role];
    if (!a || !b || a.join("\u0000") === b.join("\u0000")) return role;
    return role + ": " + (a.join(", ") || "—") + " → " + (b.join(", ") || "—");
  }

  // What changed, composed from the facts the build computed for each model, by the rules of
  // explorer/compare_facts.py's changes() and phrase(), so the picker and a static page say the same thing.
  function phrase(a, b) {
    if (b.value === null) return "no " + a.noun;
    if (a.value === null) return b.count !== null ? "adds " + b.value : "adds " + b.noun + " (" + b.value + ")";
    if (a.count !== null && b.count !== null && a.count !== b.count) {
      return grouped(String(a.count)) + " → " + grouped(String(b.count)) + " " + a.unit;
    }
    if (a.brief === b.brief) return a.label.toLowerCase() + ": " + a.value + " → " + b.value;
    return a.label.toLowerCase() + ": " + a.brief + " → " + b.brief;
  }
  function side(f) { return f.value === null ? "none" : el("a", { href: f.href }, [f.value]); }
  function changed(L, R) {
    var found = L.facts.map(function (a, i) { return [a, R.facts[i]]; })
      .filter(function (p) { return p[0].value !== p[1].value; });
    var summary = found.length ? found.map(function (p) { return phrase(p[0], p[1]); }).join("; ") :
      "No difference in heads, experts, layers, attention, context, vocabulary, MTP, vision or storage.";
    var parts = [el("h3", {}, ["What changed"]), el("p", { "class": "lede what-changed" }, [summary])];
    if (found.length) {
      var body = el("tbody");
      found.forEach(function (p) {
        body.append(el("tr", {}, [el("th", { scope: "row" }, [p[0].label]),
          el("td", { "data-label": L.name }, [side(p[0])]), el("td", { "data-label": R.name }, [side(p[1])])]));
      });
      parts.push(el("div", { "class": "table-wrap" }, [el("table", { "class": "compare changes" }, [
        el("thead", {}, [el("tr", {}, [el("th", { scope: "col" }, ["What"]), el("th", { scope: "col" }, [L.name]),
                                       el("th", { scope: "col" }, [R.name])])]), body])]),
        el("p", {}, ["Each value links the component page it is read from, in each model."]));
    }
    return el("section", { "class": "what-changed-section" }, parts);
  }

  function configTable(L, R) {
    var l = new Map(L.config), r = new Map(R.config);
    var keys = Array.from(new Set(Array.from(l.keys()).concat(Array.from(r.keys())))).sort();
    var t = el("table", { "class": "compare config" }, [el("caption", {}, ["Configuration (“—”: not published)"]),
      el("thead", {}, [el("tr", {}, [el("th", { scope: "col" }, ["Key"]), el("th", { scope: "col" }, [L.name]),
                                     el("th", { scope: "col" }, [R.name])])])]);
    var body = el("tbody");
    keys.forEach(function (k) {
      var a = l.has(k) ? l.get(k) : "—", b = r.has(k) ? r.get(k) : "—", differs = a !== b;
      var key = el("th", { scope: "row" }, [el("code", {}, [k])]);
      if (differs) key.append(" ", el("span", { "class": "mark" }, ["differs"]));
      body.append(el("tr", differs ? { "class": "differs" } : {}, [key, el("td", { "data-label": L.name }, [a]),
                                                                   el("td", { "data-label": R.name }, [b])]));
    });
    t.append(body);
    return el("div", { "class": "table-wrap" }, [t]);
  }

  function render() {
    var L = window.EXPLORER_COMPARE[pick.a.value], R = window.EXPLORER_COMPARE[pick.b.value];
    if (!L || !R) return;
    var head = ["Role", L.name, R.name, "Δ"];
    var lr = new Map(L.roles), rr = new Map(R.roles);
    var roles = L.roles.map(function (x) { return [label(x[0], L, R), lr.get(x[0]), rr.get(x[0])]; })
      .filter(function (x) { return x[1] !== "0" || x[2] !== "0"; });
    var rf = new Map(R.figures.map(function (f) { return [f[0], f[2]]; }));
    var figures = L.figures.filter(function (f) { return rf.has(f[0]); })  // as compare_views.py's compare_rows
      .map(function (f) { return [f[1] + ", in " + f[3], f[2], rf.get(f[0]), f[3].indexOf("bytes") === 0]; });
    var parts = [el("h2", {}, [link(L), " vs ", link(R)])];
    if (unknown.length) parts.push(el("p", { "class": "compare-unknown", role: "status" }, [unknown.join(" ")]));
    out.replaceChildren.apply(out, parts.concat([
      changed(L, R),
      el("p", {}, ["Each row is a role's parameters in each model; Δ is " + R.name + " minus " + L.name +
                   ", and the rows' Δ add up to the totals' Δ exactly."]),
      table("Parameters by role", head, roles, ["Total", L.total, R.total]),
      table("Per token: active parameters, KV cache, compute, memory", ["Figure", L.name, R.name, "Δ"], figures),
      configTable(L, R)]));
    try {  // keep the pair in the address, to share or reload; some browsers refuse this on file://
      ours = "#a=" + encodeURIComponent(pick.a.value) + "&b=" + encodeURIComponent(pick.b.value);
      if (!unknown.length) history.replaceState(null, "", ours);  // a link naming an unknown model stays as given
    } catch (e) { /* the comparison is shown all the same */ }
  }

  function update() { load(pick.a.value, function () { load(pick.b.value, render); }); }

  var options = Array.from(pick.a.options).map(function (o) { return o.value; });
  var unknown = [];  // what a shared link named that no model here is, said above the comparison
  var ours = "";  // the hash this script last wrote, so that its own replaceState is not read back as a new link

  // The pair the address names: each known slug chosen, each unknown one said (never swapped in silently).
  function follow() {
    var wanted = new URLSearchParams(location.hash.slice(1));
    unknown = [];
    ["a", "b"].forEach(function (side) {
      var slug = wanted.get(side);
      if (slug === null) return;
      if (options.indexOf(slug) >= 0) pick[side].value = slug;
      else unknown.push("The link names “" + slug + "” for the " + (side === "a" ? "left" : "right") +
                        " model, which is not on this site; " + pick[side].options[pick[side].selectedIndex].text +
                        " is shown instead.");
    });
    return wanted;
  }

  pick.a.value = options[0];
  pick.b.value = options.filter(function (o) { return o !== options[0]; })[0] || options[0];
  var wanted = follow();
  form.addEventListener("change", function () { unknown = []; update(); });
  window.addEventListener("hashchange", function () {
    if (location.hash === ours) return;
    var w = follow();
    if (w.has("a") && w.has("b")) update();
  });
  // Shown at once only when the address names both models (a shared link); otherwise on the reader's first choice,
  // so that nothing on the page moves before the reader asks for it.
  if (wanted.has("a") && wanted.has("b")) update();
})();
