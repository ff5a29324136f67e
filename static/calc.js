// The serving calculator: no dependencies, no network, works from file://. It evaluates the layer kinds the build
// wrote into the page (explorer/calculator.py's page_data) with the same integer arithmetic as
// explorer/calculator.py's evaluate (BigInt: exact past 2^53); the page is complete without it (the table at fixed
// contexts stays).
(function () {
  "use strict";
  var form = document.querySelector("form.calc");
  var node = document.getElementById("calc-data");
  if (!form || !node) return;
  var d = JSON.parse(node.textContent);
  var out = document.querySelector("table.calc-out");
  var fitsOut = document.getElementById("calc-fits");
  var B = BigInt, MAX = B(d.max), BLOCK = B(d.block);

  function fmt(n) { return n.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function gib(n) { var h = n * 100n / B(d.gib); return fmt(h / 100n) + "." + (h % 100n).toString().padStart(2, "0") + " GiB"; }
  function min(a, b) { return a < b ? a : b; }
  function ceilDiv(a, b) { return (a + b - 1n) / b; }

  // As explorer/components/serving.py's LayerKind.
  function cached(k) { return k.p > 0 || k.e > 0; }
  function entries(k, c) { return cached(k) ? min(c, B(k.w || k.c) || c) / B(k.r) : 0n; }
  function keysRead(k, c) {
    if (k.c) return (c - 1n) % B(k.c) + 1n;
    var e = entries(k, c);
    return k.k ? min(e, B(k.k)) : e;
  }
  function triangle(c, cap) {
    if (!cap || cap >= c) return c * (c + 1n) / 2n;
    return cap * (cap + 1n) / 2n + (c - cap) * cap;
  }
  function pooledTo(n, r) { var q = n / r, rest = n % r; return r * q * (q - 1n) / 2n + q * (rest + 1n); }
  function pooled(c, r, cap) {
    if (!cap || c < cap * r) return pooledTo(c, r);
    return pooledTo(cap * r - 1n, r) + cap * (c - cap * r + 1n);
  }
  function readPrefill(k, c) {
    if (!cached(k)) return 0n;
    if (k.c) { var ch = B(k.c), full = c / ch, rest = c % ch; return full * ch * (ch + 1n) / 2n + rest * (rest + 1n) / 2n; }
    if (k.r === 1) return triangle(c, k.w ? B(k.w) : k.k ? B(k.k) : 0n);
    return pooled(c, B(k.r), k.k ? B(k.k) : 0n);
  }
  function scoredPrefill(k, c) { return k.r === 1 ? triangle(c, k.w ? B(k.w) : 0n) : pooled(c, B(k.r), 0n); }
  function bytes(elements, half) { return ceilDiv(elements * half, 2n); }
  function kindBytes(k, c, batch, half, block) {
    if (!cached(k)) return B(k.n) * B(k.s) * batch;
    var e = ceilDiv(entries(k, c), block) * block;
    return bytes(B(k.n) * B(k.e) * e * batch, half);
  }
  function layers(n) { return n + (n === 1 ? " layer" : " layers"); }
  var SIZE = { 4: "2 bytes", 2: "1 byte", 1: "0.5 byte" };

  // As explorer/calculator.py's evaluate: the same lines, labels and equations.
  function evaluate(c, batch, kv, wname) {
    var half = 0n, w = 0n, i;
    d.kv.forEach(function (x) { if (x[0] === kv) half = B(x[1]); });
    d.weights.forEach(function (x) { if (x[0] === wname) w = B(x[1]); });
    var lines = [["weights", "Weights (" + wname + ")", w, fmt(w) + " bytes"]];
    var cache = 0n, engine = 0n, perToken = 0n, dec = [], abs = [], pre = [], parts = [], mla = false;
    d.kinds.forEach(function (k, i) {
      var v = kindBytes(k, c, batch, half, 1n), n = B(k.n);
      cache += v; parts.push(fmt(v));
      engine += kindBytes(k, c, batch, half, BLOCK);
      perToken += n * B(k.p);
      lines.push(cached(k)
        ? ["kind-" + i, k.t + " (" + layers(k.n) + ")", v,
           k.n + " × " + fmt(B(k.e)) + " × " + fmt(entries(k, c)) + " × " + SIZE[half] + " × " + batch]
        : ["kind-" + i, k.t + ": fixed state (" + layers(k.n) + ")", v, k.n + " × " + fmt(B(k.s)) + " × " + batch]);
      dec.push(n * (B(k.q) * keysRead(k, c) + B(k.x) * entries(k, c)));
      abs.push(n * (B(k.a || k.q) * keysRead(k, c) + B(k.x) * entries(k, c)));  // MLA's absorbed form, as decode_costs
      if (k.a) mla = true;
      pre.push(n * (B(k.q) * readPrefill(k, c) + B(k.x) * scoredPrefill(k, c)));
    });
    var m = B(d.matmul), sum = function (a) { return a.reduce(function (x, y) { return x + y; }, 0n); };
    lines.push(["per-token", "Cache per token of context, all layers (" + kv + ")", bytes(perToken, half),
                fmt(perToken) + " elements × " + SIZE[half]]);
    lines.push(["cache", "Cache, all layer kinds (" + batch + " × " + fmt(c) + " tokens)", cache, parts.join(" + ") || "0"]);
    lines.push(["total", "Total: weights + cache", w + cache, fmt(w) + " + " + fmt(cache)]);
    lines.push(["engine", "Engine view: cache in blocks of " + d.block + " tokens per layer", engine,
                "each layer's cached entries rounded up to a multiple of " + d.block]);
    lines.push(["engine-total", "Engine view: weights + block-rounded cache", w + engine, fmt(w) + " + " + fmt(engine)]);
    lines.push(["decode", "FLOPs per token, decode at " + fmt(c) + " context" + (mla ? d.mla[0] : ""), 2n * m + sum(dec),
                "2 × " + fmt(m) + " + " + (dec.map(fmt).join(" + ") || "0")]);
    if (mla) {
      lines.push(["decode-absorbed", "FLOPs per token, decode at " + fmt(c) + " context" + d.mla[1], 2n * m + sum(abs),
                  "2 × " + fmt(m) + " + " + abs.map(fmt).join(" + ")]);
    }
    lines.push(["prefill", "FLOPs, prefill of " + fmt(c) + " tokens (one sequence)", c * 2n * m + sum(pre),
                fmt(c) + " × 2 × " + fmt(m) + " + " + (pre.map(fmt).join(" + ") || "0")]);
    return { lines: lines, half: half, w: w };
  }

  function fits(batch, half, w, memory) {
    function ok(c) { var t = w; d.kinds.forEach(function (k) { t += kindBytes(k, c, batch, half, 1n); }); return t <= memory; }
    var lo = 0n, hi = MAX;
    if (ok(hi)) return hi;
    while (lo < hi - 1n) { var mid = (lo + hi) / 2n; if (ok(mid)) lo = mid; else hi = mid; }
    return lo;
  }

  function whole(input, fallback, top) {
    var v = parseInt(input.value, 10);
    if (!(v >= 1)) return fallback;
    return top && B(v) > top ? top : B(v);
  }

  function row(line) {
    var tr = document.createElement("tr"), flops = line[0].indexOf("decode") === 0 || line[0] === "prefill";
    tr.setAttribute("data-key", line[0]);
    var cells = [["th", line[1]], ["td", fmt(line[2])], ["td", flops ? "" : gib(line[2])], ["td", line[3]]];
    cells.forEach(function (c, i) {
      var el = document.createElement(c[0]);
      if (i === 0) el.setAttribute("scope", "row");
      if (i === 1) el.className = "num";
      if (i === 3) { var code = document.createElement("code"); code.textContent = c[1]; el.appendChild(code); }
      else el.textContent = c[1];
      tr.appendChild(el);
    });
    return tr;
  }

  function update() {
    var c = whole(form.elements.context, 1n, MAX), batch = whole(form.elements.batch, 1n, 0n);
    var r = evaluate(c, batch, form.elements.kv.value, form.elements.weights.value);
    var body = out.tBodies[0];
    while (body.firstChild) body.removeChild(body.firstChild);
    r.lines.forEach(function (line) { body.appendChild(row(line)); });
    var g = parseInt(form.elements.gpu.value, 10);
    if (!(g >= 1)) { fitsOut.textContent = "Give a GPU memory size to see how many tokens fit."; return; }
    var f = fits(batch, r.half, r.w, B(g) * B(d.gib));
    fitsOut.textContent = f === 0n
      ? "Nothing fits in " + fmt(B(g)) + " GiB: the weights and fixed state alone exceed it."
      : fmt(f) + " tokens per sequence" + (f === MAX ? " (the maximum context)" : "") + " fit in " + fmt(B(g)) +
        " GiB for " + fmt(batch) + " sequence(s).";
  }

  form.hidden = false;
  out.hidden = false;
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  form.addEventListener("submit", function (e) { e.preventDefault(); update(); });
  update();
})();
