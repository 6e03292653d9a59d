/* headlab attention viewer, part 3 of 9: the open head's panel: the view buttons' state, its header
 * (layer, head, roles, pattern class) and its statistics on this text and on the corpus.
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, el = HV.el, fmt = HV.fmt;

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
    ["distance", "mean distance attended (tokens)", "tokens"],
    ["to_special", "to every special token ([CLS], [DIST], registers)", "share"],
    ["patch_distance", "mean distance attended among the patches (patches)", "patches"],
    ["to_first", "to the first key (the first frame; the decoder's start token)", "share"],
    ["to_padding", "to the padding beyond the audio", "share"],
    ["time_distance", "mean time between a frame and the frames it attends to (s)", "seconds"],
    ["time_spread", "spread in time of the frames attended, a standard deviation (s)", "seconds"],
    ["time_order", "rank correlation of a transcript token's place with the time it attends to", "correlation"]
  ];
  Viewer.prototype.renderViews = function (item) {
    var self = this, lv = (this.level === "words" && item.words) ? item.words : item.pieces, limit = this.data.flowMaxLength;
    // rollout and flow need every head of the layers up to the open one (a cache may hold fewer)
    var rolloutOk = lv.rollout.length > this.layerOf(), flowOk = !!lv.flow && lv.flow.length > this.layerOf();
    if (this.view === "flow" && !flowOk) this.view = rolloutOk ? "rollout" : "pattern";
    if (this.view === "rollout" && !rolloutOk) this.view = "pattern";
    this.viewButtons.rollout.disabled = !rolloutOk;
    this.viewButtons.flow.disabled = !flowOk;
    this.viewHint.textContent = item.frames || item.target ?
      "(rollout and flow: not across an encoder-decoder's two sequences)" :
      !rolloutOk ? "(rollout and flow: every head of layers 0\u2013" + this.layerOf() + " is needed)" :
      flowOk ? "" : "(flow: " + (item.image ? "images" : "texts") + " of at most " + limit +
      (item.image ? " positions" : " word pieces") + "; this one has " + item.pieces.n + ")";
    Object.keys(this.viewButtons).forEach(function (k) {
      self.viewButtons[k].setAttribute("aria-pressed", String(k === self.view));
    });
  };

  Viewer.prototype.renderHeader = function (lh, info) {
    this.headTitle.textContent = "Layer " + lh[0] + " \u00B7 head " + lh[1];
    this.badges.textContent = "";
    var self = this;
    var pooled = this.level === "words" ? " At word level it is pooled from the pieces as patterns are." : "";
    if (this.view !== "pattern") {
      var what = this.view === "rollout" ? "Attention rollout" : "Attention flow";
      this.headTitle.textContent = what + " through layer " + lh[0];
      this.badges.appendChild(el("span", "hv-badge hv-class", "every head of layers 0\u2013" + lh[0] +
        " averaged, residual added"));
      this.matTitle.textContent = what + " through layer " + lh[0];
      this.matHelp.textContent = (this.view === "rollout" ?
        "Rows: each position above layer " + lh[0] + "; columns: the input tokens. A row is the product of the " +
        "head-averaged attention (plus the identity for the residual) of every layer up to here, and sums to 1." :
        "Rows: each position above layer " + lh[0] + "; columns: the input tokens. A cell is the most that can flow " +
        "from the input token to the position with each layer's head-averaged attention (plus the residual) as " +
        "capacities: an exact max-flow.") + pooled + " (Abnar & Zuidema 2020.) Click a thumbnail to pick the layer.";
      return;
    }
    this.matTitle.textContent = "Pattern";
    this.matHelp.textContent = "Rows: the attending token (query); columns: the token attended to (key).";
    var onTexts = info.corpus ? "on these texts: " : "";  // the corpus's labels lead where the page has them
    info.roles.forEach(function (r) {
      self.badges.appendChild(el("span", "hv-badge hv-role", onTexts + r.replace(/_/g, " ")));
    });
    // a head measured on the texts has a pattern class; one of a cache was not measured, so it has no label either way
    if (!info.roles.length && info["class"]) this.badges.appendChild(el("span", "hv-badge hv-none", "no role label"));
    if (info["class"]) this.badges.appendChild(el("span", "hv-badge hv-class", "pattern: " + info["class"]));
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
    var image = !!this.data.items[this.item].image, audio = !!this.data.items[this.item].frames;
    head.appendChild(el("th", null, "mean over the " + (image ? "patches" : audio ? "queries" : "tokens") +
      ", of attention\u2026"));
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
    if (!body.children.length) {  // a viewer of a cache: no text, no statistics
      this.statsBody.appendChild(el("p", "hv-help",
        "No statistics for this view: headlab.show(model, text) measures them."));
      return;
    }
    this.statsBody.appendChild(table);
    var what = image ? "image" : audio ? "recording" : "text", many = this.data.items.length > 1;
    var note = "Measured on " + (many ? "the " + this.data.items.length + " " + what + "s of this viewer" : "this " + what) +
      (image ? ", from each patch" : audio ? ", from each query (a frame that holds audio, or a decoder token)" :
        ", word-piece level") +
      "; entropy against uniform attention's.";
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
})();
