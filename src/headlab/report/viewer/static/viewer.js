/* headlab attention viewer: every layer x head as thumbnails, one head opened in full.
 *
 * Reads the payload written by headlab.report.viewer (data.py, encoding.py) from a
 * <script type="application/json"> element named by the root's data-headlab-viewer attribute.
 * Patterns arrive as row-relative bytes, deflated: weight = code * rowScale / 255.
 * Every piece of text reaches the page through textContent or canvas fillText, never as markup.
 *
 * Test hooks: window.headlabViewers lists the viewers; each root carries data-ready, data-layer,
 * data-head, data-level, data-item and data-focus; after a token is focused, every token span
 * carries data-to (the focused token's weight on it) and data-from (its weight on the focused token).
 */
(function () {
  "use strict";

  var STAT_LABELS = [
    ["to_cls", "to the first special token ([CLS] / BOS)", "share"],
    ["to_sep", "to the other special tokens ([SEP] / EOS)", "share"],
    ["to_punct", "to punctuation", "share"],
    ["to_self", "to itself", "share"],
    ["to_prev", "to the previous token", "share"],
    ["to_next", "to the next token", "share"],
    ["band", "to itself and its neighbours", "share"],
    ["block", "to its own sentence (beyond the neighbours)", "share"],
    ["top_columns", "to the two most attended tokens", "share"],
    ["confidence", "largest weight of a row", "share"],
    ["entropy", "entropy (nats)", "nats"],
    ["distance", "mean distance attended (tokens)", "tokens"]
  ];
  var COLOUR_MODES = [["row", "weight / the row's largest"], ["linear", "weight / the head's largest"],
    ["sqrt", "\u221A(weight / the head's largest)"]];
  var BLUE = [37, 99, 235];
  var ORANGE = [234, 88, 12];
  var MAX_PIXELS = 720; // matrix canvas resolution cap: longer texts are pooled by the block maximum

  var SHORT_ROLES = { previous_token: "prev", next_token: "next", punctuation: "punct", sink: "sink", broad: "broad",
    self: "self", induction_head: "induct", duplicate_token_head: "dup" };

  function shortRoles(roles) {
    if (!roles.length) return "\u00A0";
    var first = SHORT_ROLES[roles[0]] || roles[0];
    return roles.length > 1 ? first + "+" : first;
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function bytesOf(b64) {
    var bin = atob(b64);
    var out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function inflate(b64) {
    var stream = new Blob([bytesOf(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new Uint8Array(buf); });
  }

  function fmt(x, kind) {
    if (x === undefined || x === null) return "\u2013";
    if (kind === "share") return (100 * x).toFixed(1) + "%";
    return x.toFixed(2);
  }

  function fmtWeight(x) {
    return x >= 0.01 ? x.toFixed(2) : x.toPrecision(2);
  }

  function cssVar(node, name, fallback) {
    var v = getComputedStyle(node).getPropertyValue(name).trim();
    return v || fallback;
  }

  function parseRgb(text) {
    var m = /^#([0-9a-f]{6})$/i.exec(text);
    if (m) {
      var n = parseInt(m[1], 16);
      return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
    }
    var parts = text.match(/\d+/g);
    return parts && parts.length >= 3 ? [+parts[0], +parts[1], +parts[2]] : [255, 255, 255];
  }

  function Viewer(root, data) {
    this.root = root;
    this.data = data;
    this.item = 0;
    this.level = "pieces";
    this.colour = "row";
    this.selected = 0;
    this.focus = null;
    this.pinned = false;
    this.cache = {};
    this.thumbCache = {};
    this.renderId = 0;
    this.build();
    this.render();
    var self = this;
    window.addEventListener("resize", function () { if (self.current) self.drawMatrix(); });
  }

  Viewer.prototype.levelData = function () {
    var item = this.data.items[this.item];
    return (this.level === "words" && item.words) ? item.words : item.pieces;
  };

  Viewer.prototype.pattern = function (headIndex) {
    var key = this.item + "/" + this.level + "/" + headIndex;
    if (!this.cache[key]) {
      var enc = this.levelData().patterns[headIndex];
      var scale = new Float32Array(bytesOf(enc.scale).buffer);
      this.cache[key] = inflate(enc.codes).then(function (codes) {
        var peak = 0;
        for (var i = 0; i < scale.length; i++) peak = Math.max(peak, scale[i]);
        return {
          n: enc.n, codes: codes, scale: scale, peak: peak,
          value: function (q, k) { return codes[q * enc.n + k] * scale[q] / 255; }
        };
      });
    }
    return this.cache[key];
  };

  Viewer.prototype.thumbs = function () {
    var key = this.item + "/" + this.level;
    if (!this.thumbCache[key]) this.thumbCache[key] = inflate(this.levelData().thumbs);
    return this.thumbCache[key];
  };

  Viewer.prototype.build = function () {
    var self = this, d = this.data, root = this.root;
    root.classList.add("hv");
    root.textContent = "";
    var nLayers = d.nHeads.length;
    var layersShown = {};
    d.heads.forEach(function (h) { layersShown[h[0]] = true; });

    var bar = el("div", "hv-toolbar");
    var about = el("div", "hv-about");
    var name = el("strong", null, d.name);
    name.title = d.source;
    about.appendChild(name);
    about.appendChild(el("span", "hv-muted", " \u00B7 " + d.family + " \u00B7 " +
      (d.causal ? "causal (each token sees only earlier ones)" : "bidirectional") + " \u00B7 " +
      nLayers + " layers \u00D7 " + Math.max.apply(null, d.nHeads) + " heads"));
    bar.appendChild(about);
    var controls = el("div", "hv-controls");
    if (d.items.length > 1) {
      var pick = el("label", "hv-control");
      pick.appendChild(el("span", null, "Text "));
      this.itemSelect = el("select");
      d.items.forEach(function (it, i) {
        var o = el("option", null, (i + 1) + ". " + (it.text.length > 48 ? it.text.slice(0, 47) + "\u2026" : it.text));
        o.value = String(i);
        self.itemSelect.appendChild(o);
      });
      this.itemSelect.addEventListener("change", function () { self.switchTo(+self.itemSelect.value, self.level); });
      pick.appendChild(this.itemSelect);
      controls.appendChild(pick);
    }
    var seg = el("div", "hv-seg");
    seg.setAttribute("role", "group");
    seg.setAttribute("aria-label", "level");
    this.levelButtons = {};
    ["pieces", "words"].forEach(function (name) {
      var b = el("button", null, name === "pieces" ? "word pieces" : "words");
      b.type = "button";
      b.dataset.level = name;
      b.addEventListener("click", function () {
        if (!b.disabled) self.switchTo(self.item, name);
      });
      seg.appendChild(b);
      self.levelButtons[name] = b;
    });
    controls.appendChild(seg);
    this.levelHint = el("span", "hv-muted hv-hint");
    controls.appendChild(this.levelHint);
    var colour = el("label", "hv-control");
    colour.appendChild(el("span", null, "Colour "));
    this.colourSelect = el("select");
    COLOUR_MODES.forEach(function (m) {
      var o = el("option", null, m[1]);
      o.value = m[0];
      self.colourSelect.appendChild(o);
    });
    this.colourSelect.value = this.colour;
    this.colourSelect.addEventListener("change", function () { self.colour = self.colourSelect.value; self.render(); });
    colour.appendChild(this.colourSelect);
    controls.appendChild(colour);
    bar.appendChild(controls);
    root.appendChild(bar);

    this.notes = el("div", "hv-notes");
    root.appendChild(this.notes);

    var main = el("div", "hv-main");
    var left = el("div", "hv-left");
    var gridBox = el("section", "hv-panel");
    gridBox.appendChild(el("h4", null, "Every head"));
    gridBox.appendChild(el("p", "hv-help", "One thumbnail per head: layers L0\u2026 down, heads H0\u2026 across; in each, " +
      "rows attend to columns. Click one to open it."));
    var maxHeads = Math.max.apply(null, d.nHeads);
    var grid = el("div", "hv-grid");
    // thumbnails share the panel's width (at most 72 px each): a 12-head model fits a narrow column
    grid.style.gridTemplateColumns = "1.6rem repeat(" + maxHeads + ", minmax(0, 1fr))";
    grid.style.maxWidth = "calc(1.6rem + " + maxHeads * 75 + "px)";
    grid.appendChild(el("span"));
    for (var h = 0; h < maxHeads; h++) grid.appendChild(el("span", "hv-col-label", "H" + h));
    this.thumbButtons = [];
    var byAddress = {};
    d.heads.forEach(function (lh, i) { byAddress[lh[0] + "." + lh[1]] = i; });
    for (var layer = 0; layer < nLayers; layer++) {
      if (!layersShown[layer]) continue;
      grid.appendChild(el("span", "hv-row-label", "L" + layer));
      for (var head = 0; head < maxHeads; head++) {
        var idx = byAddress[layer + "." + head];
        if (idx === undefined) { grid.appendChild(el("span", "hv-empty")); continue; }
        var info = d.info[idx];
        var b = el("button", "hv-thumb");
        b.type = "button";
        b.dataset.layer = String(layer);
        b.dataset.head = String(head);
        b.dataset.index = String(idx);
        b.title = "layer " + layer + ", head " + head + (info.roles.length ? " \u2013 " + info.roles.join(", ") : "") +
          " \u2013 " + info["class"];
        b.appendChild(el("canvas"));
        b.appendChild(el("span", "hv-thumb-role", shortRoles(info.roles)));
        (function (i) { b.addEventListener("click", function () { self.select(i); }); })(idx);
        grid.appendChild(b);
        this.thumbButtons[idx] = b;
      }
    }
    var gridScroll = el("div", "hv-grid-scroll");
    gridScroll.appendChild(grid);
    gridBox.appendChild(gridScroll);
    left.appendChild(gridBox);

    var statsBox = el("section", "hv-panel");
    this.statsTitle = el("h4");
    statsBox.appendChild(this.statsTitle);
    this.statsBody = el("div");
    statsBox.appendChild(this.statsBody);
    left.appendChild(statsBox);
    main.appendChild(left);

    var right = el("div", "hv-right");
    var headBox = el("section", "hv-panel");
    this.headTitle = el("h3", "hv-head-title");
    headBox.appendChild(this.headTitle);
    this.badges = el("div", "hv-badges");
    headBox.appendChild(this.badges);
    var legend = el("div", "hv-legend");
    var l1 = el("span", "hv-key hv-key-to");
    legend.appendChild(l1);
    legend.appendChild(el("span", null, "the hovered token attends to it"));
    var l2 = el("span", "hv-key hv-key-from");
    legend.appendChild(l2);
    legend.appendChild(el("span", null, "it attends to the hovered token"));
    legend.appendChild(el("span", "hv-muted", "(darkest = strongest; click a token to pin it)"));
    headBox.appendChild(legend);
    this.text = el("div", "hv-text");
    this.text.addEventListener("mouseleave", function () { if (!self.pinned) self.clearFocus(false); });
    headBox.appendChild(this.text);
    this.focusLine = el("div", "hv-focus");
    headBox.appendChild(this.focusLine);
    right.appendChild(headBox);

    var matBox = el("section", "hv-panel");
    matBox.appendChild(el("h4", null, "Pattern"));
    matBox.appendChild(el("p", "hv-help", "Rows: the attending token (query); columns: the token attended to (key)."));
    this.canvas = el("canvas", "hv-matrix");
    this.canvas.addEventListener("mousemove", function (ev) { self.matrixHover(ev); });
    this.canvas.addEventListener("mouseleave", function () { self.matrixStatus.textContent = "\u00A0"; self.drawMatrix(); });
    matBox.appendChild(this.canvas);
    this.matrixStatus = el("div", "hv-status", "\u00A0");
    matBox.appendChild(this.matrixStatus);
    right.appendChild(matBox);
    main.appendChild(right);
    root.appendChild(main);
  };

  Viewer.prototype.switchTo = function (item, level) {
    // another text or level: the open pattern and its positions no longer apply
    this.current = null;
    this.clearFocus(true);
    this.item = item;
    this.level = level;
    this.render();
  };

  Viewer.prototype.select = function (index) {
    this.selected = index;
    this.render();
  };

  Viewer.prototype.selectHead = function (layer, head) {
    for (var i = 0; i < this.data.heads.length; i++) {
      if (this.data.heads[i][0] === layer && this.data.heads[i][1] === head) { this.select(i); return; }
    }
    throw new Error("head " + layer + "." + head + " is not shown");
  };

  Viewer.prototype.render = function () {
    var self = this, d = this.data, item = d.items[this.item];
    var id = ++this.renderId;
    this.root.dataset.ready = "0";
    this.levelButtons.words.disabled = !item.words;
    this.levelButtons.words.title = item.words ? "words: attention to a word sums its pieces, from a word averages them" :
      "every word of this text is a single piece";
    this.levelHint.textContent = item.words ? "" : "(every word here is one piece)";
    if (!item.words) this.level = "pieces";
    Object.keys(this.levelButtons).forEach(function (k) {
      self.levelButtons[k].setAttribute("aria-pressed", String(k === self.level));
    });
    this.notes.textContent = "";
    d.notes.forEach(function (n) { self.notes.appendChild(el("p", null, n)); });
    var lh = d.heads[this.selected], info = d.info[this.selected];
    this.root.dataset.layer = String(lh[0]);
    this.root.dataset.head = String(lh[1]);
    this.root.dataset.level = this.level;
    this.root.dataset.item = String(this.item);
    this.thumbButtons.forEach(function (b, i) { if (b) b.setAttribute("aria-pressed", String(i === self.selected)); });
    this.renderHeader(lh, info);
    this.renderStats(lh, info);
    this.renderText();
    return Promise.all([this.pattern(this.selected), this.thumbs()]).then(function (got) {
      if (id !== self.renderId) return;
      self.current = got[0];
      self.drawThumbs(got[1]);
      self.drawMatrix();
      if (self.focus !== null) self.applyFocus(self.focus);
      self.root.dataset.ready = "1";
    });
  };

  Viewer.prototype.renderHeader = function (lh, info) {
    this.headTitle.textContent = "Layer " + lh[0] + " \u00B7 head " + lh[1];
    this.badges.textContent = "";
    var self = this;
    info.roles.forEach(function (r) { self.badges.appendChild(el("span", "hv-badge hv-role", r.replace(/_/g, " "))); });
    if (!info.roles.length) this.badges.appendChild(el("span", "hv-badge hv-none", "no role label"));
    this.badges.appendChild(el("span", "hv-badge hv-class", "pattern: " + info["class"]));
    if (info.corpus) {
      var cr = (info.corpus.roles || "").split(" ").filter(Boolean);
      var txt = "on the corpus: " + (cr.length ? cr.join(", ").replace(/_/g, " ") : "no role") +
        (info.corpus.pattern_class ? " \u00B7 " + info.corpus.pattern_class : "");
      this.badges.appendChild(el("span", "hv-badge hv-corpus", txt));
    }
  };

  Viewer.prototype.renderStats = function (lh, info) {
    var corpus = info.corpus;
    this.statsTitle.textContent = "Layer " + lh[0] + " \u00B7 head " + lh[1] + ": where its attention goes";
    var table = el("table", "hv-stats");
    var head = el("tr");
    head.appendChild(el("th", null, "mean over the tokens, of attention\u2026"));
    head.appendChild(el("th", "hv-num", corpus ? "these texts" : "value"));
    if (corpus) head.appendChild(el("th", "hv-num", "corpus"));
    var thead = el("thead");
    thead.appendChild(head);
    table.appendChild(thead);
    var body = el("tbody");
    STAT_LABELS.forEach(function (s) {
      var v = info.stats[s[0]];
      if (v === undefined && !(corpus && corpus[s[0]] !== undefined)) return;
      var tr = el("tr");
      tr.dataset.stat = s[0];
      var name = el("td");
      name.appendChild(el("span", null, s[1]));
      if (s[2] === "share" && v !== undefined) {
        var barBox = el("span", "hv-bar");
        var fill = el("span");
        fill.style.width = Math.max(0, Math.min(100, 100 * v)) + "%";
        barBox.appendChild(fill);
        name.appendChild(barBox);
      }
      tr.appendChild(name);
      var cell = el("td", "hv-num", fmt(v, s[2]));
      if (s[0] === "entropy" && info.stats.uniform_entropy !== undefined) {
        cell.title = "uniform attention would give " + info.stats.uniform_entropy.toFixed(2) + " nats";
        cell.textContent = fmt(v, s[2]) + " / " + info.stats.uniform_entropy.toFixed(2);
      }
      tr.appendChild(cell);
      if (corpus) tr.appendChild(el("td", "hv-num", fmt(corpus[s[0]], s[2])));
      body.appendChild(tr);
    });
    table.appendChild(body);
    this.statsBody.textContent = "";
    this.statsBody.appendChild(table);
    var note = "Measured on " + (this.data.items.length > 1 ? "the " + this.data.items.length + " texts of this viewer" : "this text") +
      ", word-piece level; entropy against uniform attention's.";
    var rank = this.importanceRank(info);
    if (rank) note += " On the corpus this head ranks " + rank + " by gradient importance (1 = most important).";
    this.statsBody.appendChild(el("p", "hv-help", note));
  };

  Viewer.prototype.importanceRank = function (info) {
    var mine = info.corpus ? info.corpus.importance_gradient : null;
    if (mine === undefined || mine === null) return null;
    var all = this.data.info.filter(function (i) { return i.corpus && i.corpus.importance_gradient !== null &&
      i.corpus.importance_gradient !== undefined; });
    var above = all.filter(function (i) { return i.corpus.importance_gradient > mine; }).length;
    return (above + 1) + " of " + all.length;
  };

  Viewer.prototype.renderText = function () {
    var key = this.item + "/" + this.level;
    if (this.textKey === key) return;
    this.textKey = key;
    var self = this, lv = this.levelData(), item = this.data.items[this.item];
    this.text.textContent = "";
    this.tokens = [];
    var frag = document.createDocumentFragment();
    for (var i = 0; i < lv.n; i++) {
      if (lv.gaps[i]) frag.appendChild(document.createTextNode(lv.gaps[i]));
      var s = el("span", "hv-tok" + (lv.special[i] ? " hv-special" : "") + (lv.pieces[i] > 1 ? " hv-multi" : ""), lv.labels[i]);
      s.dataset.pos = String(i);
      if (this.level === "pieces" && i > 0 && !lv.gaps[i] && !lv.special[i] && !lv.special[i - 1]) s.classList.add("hv-join");
      frag.appendChild(s);
      this.tokens.push(s);
    }
    if (lv.tail) {
      var tail = el("span", item.truncated ? "hv-cut" : null, lv.tail);
      if (item.truncated) tail.title = "beyond the model's limit: not run";
      frag.appendChild(tail);
    }
    this.text.appendChild(frag);
    this.text.onmouseover = function (ev) {
      var t = ev.target.closest ? ev.target.closest(".hv-tok") : null;
      if (t && !self.pinned) self.setFocus(+t.dataset.pos);
    };
    this.text.onclick = function (ev) {
      var t = ev.target.closest ? ev.target.closest(".hv-tok") : null;
      if (!t) return;
      var pos = +t.dataset.pos;
      if (self.pinned && self.focus === pos) { self.pinned = false; return; }
      self.pinned = true;
      self.setFocus(pos);
    };
  };

  Viewer.prototype.setFocus = function (pos) {
    this.focus = pos;
    this.root.dataset.focus = String(pos);
    if (this.current && this.root.dataset.ready === "1") { this.applyFocus(pos); this.drawMatrix(); }
  };

  Viewer.prototype.clearFocus = function (unpin) {
    if (unpin) this.pinned = false;
    this.focus = null;
    delete this.root.dataset.focus;
    (this.tokens || []).forEach(function (s) {
      s.style.backgroundColor = ""; s.style.boxShadow = ""; s.removeAttribute("data-to"); s.removeAttribute("data-from");
      s.classList.remove("hv-focused"); s.removeAttribute("title");
    });
    this.focusLine.textContent = "Hover over a token to see what it attends to and what attends to it.";
    if (this.current) this.drawMatrix();
  };

  Viewer.prototype.applyFocus = function (pos) {
    var p = this.current, n = p.n, lv = this.levelData();
    if (pos >= n) return;
    var to = new Float64Array(n), from = new Float64Array(n), maxTo = 0, maxFrom = 0;
    for (var j = 0; j < n; j++) {
      to[j] = p.value(pos, j); from[j] = p.value(j, pos);
      if (to[j] > maxTo) maxTo = to[j];
      if (from[j] > maxFrom) maxFrom = from[j];
    }
    for (j = 0; j < n; j++) {
      var s = this.tokens[j], a = maxTo > 0 ? to[j] / maxTo : 0, b = maxFrom > 0 ? from[j] / maxFrom : 0;
      s.dataset.to = String(to[j]);
      s.dataset.from = String(from[j]);
      s.style.backgroundColor = a > 0.004 ? "rgba(" + BLUE.join(",") + "," + (0.08 + 0.72 * a).toFixed(3) + ")" : "";
      s.style.boxShadow = b > 0.004 ? "inset 0 -4px 0 rgba(" + ORANGE.join(",") + "," + (0.15 + 0.85 * b).toFixed(3) + ")" : "";
      s.classList.toggle("hv-focused", j === pos);
      s.title = "weight from the hovered token: " + fmtWeight(to[j]) + "\nweight to the hovered token: " + fmtWeight(from[j]);
    }
    this.focusLine.textContent = "";
    var who = el("strong", null, "\u201C" + lv.labels[pos] + "\u201D");
    this.focusLine.appendChild(who);
    this.focusLine.appendChild(el("span", "hv-muted", " (position " + pos + (this.pinned ? ", pinned" : "") + ")"));
    this.focusLine.appendChild(this.topList(" attends most to ", to, "hv-to"));
    this.focusLine.appendChild(this.topList(" \u00B7 attended most by ", from, "hv-from"));
  };

  Viewer.prototype.topList = function (lead, values, cls) {
    var lv = this.levelData(), order = [];
    for (var i = 0; i < values.length; i++) order.push(i);
    order.sort(function (a, b) { return values[b] - values[a]; });
    var span = el("span");
    span.appendChild(el("span", null, lead));
    var shown = order.slice(0, 4).filter(function (i) { return values[i] > 0; });
    if (!shown.length) span.appendChild(el("span", "hv-muted", "nothing (no later token sees it)"));
    shown.forEach(function (i, k) {
      var chip = el("span", "hv-chip " + cls, lv.labels[i] + " " + fmtWeight(values[i]));
      span.appendChild(chip);
      if (k < shown.length - 1) span.appendChild(document.createTextNode(" "));
    });
    return span;
  };

  Viewer.prototype.ramp = function () {
    return [parseRgb(cssVar(this.root, "--hv-ramp-low", "#ffffff")), parseRgb(cssVar(this.root, "--hv-ramp-high", "#08306b"))];
  };

  Viewer.prototype.shade = function (t, ramp, out, o) {
    if (this.colour === "sqrt") t = Math.sqrt(t);
    out[o] = ramp[0][0] + (ramp[1][0] - ramp[0][0]) * t;
    out[o + 1] = ramp[0][1] + (ramp[1][1] - ramp[0][1]) * t;
    out[o + 2] = ramp[0][2] + (ramp[1][2] - ramp[0][2]) * t;
    out[o + 3] = 255;
  };

  Viewer.prototype.drawThumbs = function (codes) {
    var lv = this.levelData(), t = lv.thumbSize, ramp = this.ramp(), self = this;
    this.thumbButtons.forEach(function (b, idx) {
      if (!b) return;
      var c = b.querySelector("canvas");
      c.width = c.height = t;
      var ctx = c.getContext("2d"), img = ctx.createImageData(t, t), base = idx * t * t;
      var rowMode = self.colour === "row";
      for (var q = 0; q < t; q++) {
        var rmax = 0;
        if (rowMode) for (var k = 0; k < t; k++) rmax = Math.max(rmax, codes[base + q * t + k]);
        for (k = 0; k < t; k++) {
          var v = codes[base + q * t + k] / 255;
          if (rowMode) v = rmax > 0 ? codes[base + q * t + k] / rmax : 0;
          self.shade(v, ramp, img.data, 4 * (q * t + k));
        }
      }
      ctx.putImageData(img, 0, 0);
    });
  };

  Viewer.prototype.matrixLayout = function () {
    // as wide as the panel allows (at most 760 px); token labels on both axes when a cell can hold them
    var n = this.current.n, panel = this.canvas.parentElement;
    var room = Math.max(240, Math.min(760, (panel ? panel.clientWidth : 600) - 24));
    var labels = (room - 86) / n >= 10;
    var margin = labels ? 86 : 8;
    var cell = labels ? Math.min(26, Math.floor((room - margin) / n)) : 0;
    var grid = labels ? cell * n : room - margin;
    return { n: n, labels: labels, grid: grid, margin: margin, size: grid + margin + 4 };
  };

  Viewer.prototype.drawMatrix = function () {
    if (!this.current) return;
    var p = this.current, L = this.matrixLayout(), n = p.n, ramp = this.ramp();
    var res = Math.min(n, MAX_PIXELS), dpr = window.devicePixelRatio || 1;
    if (!this.offscreen || this.offscreenKey !== this.renderId + "/" + this.colour) {
      var off = document.createElement("canvas");
      off.width = off.height = res;
      var octx = off.getContext("2d"), img = octx.createImageData(res, res);
      for (var r = 0; r < res; r++) {
        var q0 = Math.floor(r * n / res), q1 = Math.max(q0 + 1, Math.floor((r + 1) * n / res));
        for (var c = 0; c < res; c++) {
          var k0 = Math.floor(c * n / res), k1 = Math.max(k0 + 1, Math.floor((c + 1) * n / res)), best = 0;
          for (var q = q0; q < q1; q++) {
            for (var k = k0; k < k1; k++) {
              var v = this.colour === "row" ? p.codes[q * n + k] / 255 : (p.peak > 0 ? p.value(q, k) / p.peak : 0);
              if (v > best) best = v;
            }
          }
          this.shade(best, ramp, img.data, 4 * (r * res + c));
        }
      }
      octx.putImageData(img, 0, 0);
      this.offscreen = off;
      this.offscreenKey = this.renderId + "/" + this.colour;
    }
    var cv = this.canvas;
    cv.width = Math.round(L.size * dpr);
    cv.height = Math.round(L.size * dpr);
    cv.style.width = cv.style.height = L.size + "px";
    var ctx = cv.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, L.size, L.size);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.offscreen, L.margin, L.margin, L.grid, L.grid);
    var fg = cssVar(this.root, "--hv-fg", "#1f2328"), border = cssVar(this.root, "--hv-border", "#d1d9e0");
    ctx.strokeStyle = border;
    ctx.lineWidth = 1;
    ctx.strokeRect(L.margin - 0.5, L.margin - 0.5, L.grid + 1, L.grid + 1);
    var lv = this.levelData(), step = L.grid / n;
    if (L.labels) {
      ctx.fillStyle = fg;
      ctx.font = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (var i = 0; i < n; i++) {
        var s = lv.labels[i].length > 11 ? lv.labels[i].slice(0, 10) + "\u2026" : lv.labels[i];
        ctx.fillText(s, L.margin - 4, L.margin + (i + 0.5) * step);
        ctx.save();
        ctx.translate(L.margin + (i + 0.5) * step, L.margin - 4);
        ctx.rotate(-Math.PI / 3);
        ctx.textAlign = "left";
        ctx.fillText(s, 0, 0);
        ctx.restore();
      }
    }
    if (this.focus !== null && this.focus < n) {
      // the focused token's row (what it attends to) and column (what attends to it)
      var at = L.margin + this.focus * step, w = Math.max(step, 1);
      ctx.strokeStyle = fg;
      ctx.lineWidth = step >= 3 ? 1.5 : 1;
      ctx.setLineDash(step >= 3 ? [] : [4, 3]);
      ctx.strokeRect(L.margin, at, L.grid, w);
      ctx.strokeRect(at, L.margin, w, L.grid);
      ctx.setLineDash([]);
    }
    if (this.hoverCell) {
      ctx.strokeStyle = "rgba(" + ORANGE.join(",") + ",0.95)";
      ctx.lineWidth = 2;
      ctx.strokeRect(L.margin + this.hoverCell[1] * step, L.margin + this.hoverCell[0] * step, Math.max(step, 2), Math.max(step, 2));
    }
  };

  Viewer.prototype.matrixHover = function (ev) {
    if (!this.current) return;
    var L = this.matrixLayout(), rect = this.canvas.getBoundingClientRect();
    var x = ev.clientX - rect.left - L.margin, y = ev.clientY - rect.top - L.margin, n = this.current.n;
    if (x < 0 || y < 0 || x >= L.grid || y >= L.grid) { this.hoverCell = null; this.matrixStatus.textContent = "\u00A0"; this.drawMatrix(); return; }
    var q = Math.min(n - 1, Math.floor(y * n / L.grid)), k = Math.min(n - 1, Math.floor(x * n / L.grid));
    var lv = this.levelData();
    this.hoverCell = [q, k];
    this.matrixStatus.textContent = "\u201C" + lv.labels[q] + "\u201D (" + q + ") \u2192 \u201C" + lv.labels[k] + "\u201D (" + k + "): " +
      fmtWeight(this.current.value(q, k));
    this.drawMatrix();
    this.hoverCell = null;
  };

  window.headlabViewers = window.headlabViewers || [];

  function boot() {
    var roots = document.querySelectorAll("[data-headlab-viewer]");
    for (var i = 0; i < roots.length; i++) {
      var root = roots[i];
      if (root.dataset.mounted) continue;
      root.dataset.mounted = "1";
      var source = document.getElementById(root.dataset.headlabViewer);
      try {
        window.headlabViewers.push(new Viewer(root, JSON.parse(source.textContent)));
      } catch (err) {
        root.textContent = "The viewer could not start: " + err;
        root.dataset.ready = "error";
        throw err;
      }
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
