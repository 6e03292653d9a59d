/* headlab attention viewer, part 2 of 9: every layer x head as thumbnails, one head opened in full.
 *
 * Reads the payload written by headlab.report.viewer (data.py, encoding.py) from a
 * script element of type application/json named by the root's data-headlab-viewer attribute.
 * Patterns arrive as row-relative bytes, deflated: weight = code * rowScale / 255.
 * Every piece of text reaches the page through textContent or canvas fillText, never as markup.
 *
 * Beside a head's pattern the viewer shows two views of the whole model up to the open head's layer
 * (Abnar & Zuidema 2020; headlab.analysis.flow): attention rollout and, for texts within the payload's
 * flowMaxLength pieces, attention flow.
 *
 * A pattern is over the item's positions both ways, unless the payload's axes name the open head's query and key
 * axes: "tokens" (the level's labels), "frames" (an audio item's frame strip, audio.js) or "target" (a pair's
 * target, shown below its source: tokens.js). The focus is a position on one axis (focusAxis); what it reaches is
 * read from the matrix shown (focusWeights, tokens.js).
 *
 * Test hooks: window.headlabViewers lists the viewers; each root carries data-ready, data-layer,
 * data-head, data-level, data-item, data-view (pattern, rollout or flow) and data-focus; after a
 * token is focused, every token span carries data-to (the focused token's weight on it) and data-from
 * (its weight on the focused token), read from the matrix shown.
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var el = HV.el, shortRoles = HV.shortRoles, inflate = HV.inflate, bytesOf = HV.bytesOf;

  var VIEWS = [["pattern", "pattern", "the open head's attention"],
    ["rollout", "rollout", "attention rollout: every head of the layers up to the open head's, averaged, residual added, multiplied through"],
    ["flow", "flow", "attention flow: the max-flow from each input token to each position, attention as capacities"]];
  var COLOUR_MODES = [["row", "weight / the row's largest"], ["linear", "weight / the head's largest"],
    ["sqrt", "\u221A(weight / the head's largest)"]];
  function Viewer(root, data) {
    this.root = root;
    this.data = data;
    this.item = 0;
    this.level = "pieces";
    this.colour = "row";
    this.view = "pattern";
    this.selected = 0;
    this.focus = null;
    this.focusAxis = "tokens";
    this.pinned = false;
    this.cache = {};
    this.thumbCache = {};
    this.renderId = 0;
    this.build();
    this.render();
    var self = this;
    window.addEventListener("resize", function () { if (self.current && self.root.isConnected) self.drawMatrix(); });
  }

  Viewer.prototype.levelData = function () {
    var item = this.data.items[this.item];
    return (this.level === "words" && item.words) ? item.words : item.pieces;
  };

  Viewer.prototype.layerOf = function () { return this.data.heads[this.selected][0]; };

  // the open view's [query axis, key axis]: a head's own (payload axes), else the level's positions both ways
  Viewer.prototype.axes = function () {
    return this.data.axes && this.view === "pattern" ? this.data.axes[this.selected] : ["tokens", "tokens"];
  };

  Viewer.prototype.axisLabels = function (axis) {
    var item = this.data.items[this.item];
    return axis === "frames" ? item.frames.labels : axis === "target" ? item.target.labels : this.levelData().labels;
  };

  // the encoded matrix the open view shows: the head's pattern, or rollout / flow through its layer
  Viewer.prototype.shown = function () {
    var lv = this.levelData();
    if (this.view === "rollout") return { key: "rollout" + this.layerOf(), enc: lv.rollout[this.layerOf()] };
    if (this.view === "flow" && lv.flow) return { key: "flow" + this.layerOf(), enc: lv.flow[this.layerOf()] };
    return { key: "head" + this.selected, enc: lv.patterns[this.selected] };
  };

  Viewer.prototype.pattern = function () {
    var shown = this.shown(), key = this.item + "/" + this.level + "/" + shown.key;
    if (!this.cache[key]) {
      var enc = shown.enc, m = enc.m || enc.n, axes = this.axes();
      var scale = new Float32Array(bytesOf(enc.scale).buffer);
      this.cache[key] = inflate(enc.codes).then(function (codes) {
        var peak = 0;
        for (var i = 0; i < scale.length; i++) peak = Math.max(peak, scale[i]);
        return {
          n: enc.n, m: m, axes: axes, codes: codes, scale: scale, peak: peak,
          value: function (q, k) { return codes[q * m + k] * scale[q] / 255; }
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
    about.appendChild(el("span", "hv-muted", " \u00B7 " + d.architecture + " \u00B7 " +
      (d.causal ? "causal (each token sees only earlier ones)" : "bidirectional") + " \u00B7 " +
      nLayers + " layers \u00D7 " + Math.max.apply(null, d.nHeads) + " heads"));
    bar.appendChild(about);
    var controls = el("div", "hv-controls");
    if (d.items.length > 1) {
      var pick = el("label", "hv-control");
      pick.appendChild(el("span", null, d.items[0].image ? "Image " : d.items[0].frames ? "Recording " :
        d.items[0].target ? "Pair " : "Text "));
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
    // an image, a recording and a pair (its heads read two texts) have no words
    if (d.items.every(function (it) { return it.image || it.frames || it.target; })) seg.style.display = "none";
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
    var views = el("div", "hv-seg hv-views");
    views.setAttribute("role", "group");
    views.setAttribute("aria-label", "view");
    this.viewButtons = {};
    VIEWS.forEach(function (v) {
      var b = el("button", null, v[1]);
      b.type = "button";
      b.dataset.view = v[0];
      b.title = v[2];
      b.addEventListener("click", function () {
        if (!b.disabled) { self.view = v[0]; self.render(); }
      });
      views.appendChild(b);
      self.viewButtons[v[0]] = b;
    });
    controls.appendChild(views);
    this.viewHint = el("span", "hv-muted hv-view-hint");
    controls.appendChild(this.viewHint);
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
        // one source for the labels: the corpus's where the page has them, else the viewed texts' (said so)
        var roles = info.corpus ? (info.corpus.roles || "").split(" ").filter(Boolean) : info.roles;
        b.title = "layer " + layer + ", head " + head + (roles.length ? " \u2013 " + (info.corpus ? "on the corpus: " :
          "on these texts: ") + roles.join(", ") : "") + (info["class"] ? " \u2013 " + info["class"] : "");
        b.appendChild(el("canvas"));
        b.appendChild(el("span", "hv-thumb-role", shortRoles(roles)));
        (function (i) { b.addEventListener("click", function () { self.select(i); }); })(idx);
        grid.appendChild(b);
        this.thumbButtons[idx] = b;
      }
    }
    var gridScroll = el("div", "hv-grid-scroll");
    gridScroll.appendChild(grid);
    gridBox.appendChild(gridScroll);
    left.appendChild(gridBox);
    if (d.circuit) left.appendChild(this.buildCircuit());  // circuit.js: edge scores came with the payload

    var statsBox = el("section", "hv-panel");
    this.statsTitle = el("h4");
    statsBox.appendChild(this.statsTitle);
    this.statsBody = el("div");
    statsBox.appendChild(this.statsBody);
    left.appendChild(statsBox);
    main.appendChild(left);

    var right = el("div", "hv-right");
    this.buildImage(right);  // image.js: an image model's picture under its patch grid
    this.buildFrames(right);  // audio.js: an audio model's encoder frames, a strip of times
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
    var pair = el("div", "hv-pair"), sourceBox = el("div");  // a pair's source and target side by side
    this.sourceLabel = el("div", "hv-side", "Source (what the encoder reads)");
    sourceBox.appendChild(this.sourceLabel);
    this.text = el("div", "hv-text");
    this.text.addEventListener("mouseleave", function () { if (!self.pinned) self.clearFocus(false); });
    sourceBox.appendChild(this.text);
    pair.appendChild(sourceBox);
    this.buildTarget(pair);  // tokens.js: a pair's target, beside its source
    headBox.appendChild(pair);
    this.focusLine = el("div", "hv-focus");
    headBox.appendChild(this.focusLine);
    right.appendChild(headBox);

    var matBox = el("section", "hv-panel");
    this.matTitle = el("h4", null, "Pattern");
    matBox.appendChild(this.matTitle);
    this.matHelp = el("p", "hv-help", "Rows: the attending token (query); columns: the token attended to (key).");
    matBox.appendChild(this.matHelp);
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
    throw new Error("head L" + layer + " H" + head + " is not shown");
  };

  Viewer.prototype.render = function () {
    var self = this, d = this.data, item = d.items[this.item];
    var id = ++this.renderId;
    this.root.dataset.ready = "0";
    this.levelButtons.words.disabled = !item.words;
    this.levelButtons.words.title = item.words ? "words: attention to a word sums its pieces, from a word averages them" :
      "every word of this text is a single piece";
    this.levelHint.textContent = item.words || item.image || item.frames || item.target ? "" :
      "(every word here is one piece)";
    if (!item.words) this.level = "pieces";
    this.renderViews(item);
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
    this.root.dataset.view = this.view;
    this.thumbButtons.forEach(function (b, i) { if (b) b.setAttribute("aria-pressed", String(i === self.selected)); });
    this.renderHeader(lh, info);
    this.renderStats(lh, info);
    if (this.circuitBody) this.renderCircuit(lh);
    this.renderText();
    this.renderTarget();
    this.renderImage();
    this.renderFrames();
    return Promise.all([this.pattern(), this.thumbs()]).then(function (got) {
      if (id !== self.renderId) return;
      self.current = got[0];
      self.drawThumbs(got[1]);
      self.drawMatrix();
      if (self.focus !== null) self.applyFocus(self.focus);
      self.root.dataset.ready = "1";
    });
  };

  HV.Viewer = Viewer;
})();
