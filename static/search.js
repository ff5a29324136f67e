// Offline search: no dependencies, no network. The page is complete without this script; it only adds
// the search box. The index (search-index.js) is loaded on first use, by a script tag, so file:// works.
(function () {
  "use strict";
  var form = document.querySelector("form.search");
  if (!form) return;
  var root = form.getAttribute("data-root") || "";
  var input = form.querySelector("input");
  var list = form.querySelector("ol");
  var loading = false;
  form.hidden = false;

  function load(then) {
    if (window.EXPLORER_SEARCH) return then();
    if (loading) return;
    loading = true;
    var s = document.createElement("script");
    s.src = root + "search-index.js";
    s.onload = then;
    document.head.appendChild(s);
  }

  function score(entry, terms) {
    var title = entry.t.toLowerCase(), hay = (entry.t + " " + entry.m + " " + entry.p + " " + entry.k).toLowerCase();
    var total = 0;
    for (var i = 0; i < terms.length; i++) {
      var t = terms[i];
      if (hay.indexOf(t) < 0) return 0;
      total += title.indexOf(t) === 0 ? 8 : title.indexOf(t) >= 0 ? 4 : (" " + entry.k.toLowerCase() + " ").indexOf(" " + t + " ") >= 0 ? 3 : 1;
    }
    return total;
  }

  function render() {
    var q = input.value.trim().toLowerCase();
    list.innerHTML = "";
    if (!q || !window.EXPLORER_SEARCH) return;
    var terms = q.split(/\s+/);
    var hits = window.EXPLORER_SEARCH.map(function (e) { return [score(e, terms), e]; })
      .filter(function (p) { return p[0] > 0; })
      .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 12);
    if (!hits.length) {
      var none = document.createElement("li");
      none.className = "none";
      none.textContent = "No component matches “" + input.value.trim() + "”.";
      list.appendChild(none);
      return;
    }
    hits.forEach(function (p) {
      var e = p[1], li = document.createElement("li"), a = document.createElement("a");
      a.href = root + e.u;
      a.textContent = e.t;
      var where = document.createElement("span");
      where.textContent = e.m + (e.p ? " › " + e.p : "");
      a.appendChild(where);
      li.appendChild(a);
      list.appendChild(li);
    });
  }

  input.addEventListener("focus", function () { load(render); });
  input.addEventListener("input", function () { load(render); });
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var first = list.querySelector("a");
    if (first) window.location.href = first.href;
  });
  form.addEventListener("keydown", function (ev) {
    var links = Array.prototype.slice.call(list.querySelectorAll("a"));
    var i = links.indexOf(document.activeElement);
    if (ev.key === "ArrowDown" && links.length) { ev.preventDefault(); links[Math.min(i + 1, links.length - 1)].focus(); }
    if (ev.key === "ArrowUp" && links.length) { ev.preventDefault(); (i <= 0 ? input : links[i - 1]).focus(); }
    if (ev.key === "Escape") { input.value = ""; render(); input.focus(); }
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "/" && document.activeElement !== input && !ev.ctrlKey && !ev.metaKey) { ev.preventDefault(); input.focus(); }
  });
})();
