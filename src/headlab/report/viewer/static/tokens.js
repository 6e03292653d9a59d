/* headlab attention viewer, part 5 of 9: the text as tokens; focusing one shows what it attends to and what
 * attends to it (every span then carries data-to and data-from: the test hooks). Where the open head's keys are not
 * tokens (cross-attention reads an audio model's frames: audio.js), a focused token's weights go to the frames and
 * the spans carry no data-to; where its queries are not tokens, no data-from. A (source, target) pair shows its
 * target beside its source, on the axis "target": a cross-attention head's focused target token paints the source
 * tokens it attends to (data-to), a focused source token the target tokens that attend to it (data-from).
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, el = HV.el, fmtWeight = HV.fmtWeight, BLUE = HV.BLUE, ORANGE = HV.ORANGE;

  Viewer.prototype.renderText = function () {
    var key = this.item + "/" + this.level;
    if (this.textKey === key) return;
    this.textKey = key;
    var item = this.data.items[this.item];
    this.sourceLabel.style.display = item.target ? "" : "none";
    this.tokens = this.fillStrip(this.text, this.levelData(), item.truncated, "tokens");
  };

  // a pair's target (what its decoder reads), beside the source: focused and painted on the axis "target"
  Viewer.prototype.buildTarget = function (parent) {
    var self = this;
    this.targetBox = el("div");
    this.targetBox.appendChild(el("div", "hv-side", "Target (what the decoder reads: its start token, then the " +
      "target less its last piece)"));
    this.targetText = el("div", "hv-text hv-target");
    this.targetText.addEventListener("mouseleave", function () { if (!self.pinned) self.clearFocus(false); });
    this.targetBox.appendChild(this.targetText);
    parent.appendChild(this.targetBox);
  };

  Viewer.prototype.renderTarget = function () {
    var item = this.data.items[this.item];
    this.targetBox.style.display = item.target ? "" : "none";
    if (!item.target || this.targetKey === this.item) return;
    this.targetKey = this.item;
    this.targetTokens = this.fillStrip(this.targetText, item.target, false, "target");
  };

  // a level's tokens as spans in box (focus on axis when hovered or clicked); returns the spans
  Viewer.prototype.fillStrip = function (box, lv, truncated, axis) {
    var self = this, spans = [];
    box.textContent = "";
    var frag = document.createDocumentFragment();
    for (var i = 0; i < lv.n; i++) {
      if (lv.gaps[i]) frag.appendChild(document.createTextNode(lv.gaps[i]));
      var s = el("span", "hv-tok" + (lv.special[i] ? " hv-special" : "") + (lv.pieces[i] > 1 ? " hv-multi" : ""), lv.labels[i]);
      s.dataset.pos = String(i);
      if (lv.name === "pieces" && i > 0 && !lv.gaps[i] && !lv.special[i] && !lv.special[i - 1]) s.classList.add("hv-join");
      frag.appendChild(s);
      spans.push(s);
    }
    if (lv.tail) {
      var tail = el("span", truncated ? "hv-cut" : null, lv.tail);
      if (truncated) tail.title = "beyond the model's limit: not run";
      frag.appendChild(tail);
    }
    box.appendChild(frag);
    box.onmouseover = function (ev) {
      var t = ev.target.closest ? ev.target.closest(".hv-tok") : null;
      if (t && !self.pinned) self.setFocus(+t.dataset.pos, axis);
    };
    box.onclick = function (ev) {
      var t = ev.target.closest ? ev.target.closest(".hv-tok") : null;
      if (t) self.pinFocus(+t.dataset.pos, axis);
    };
    return spans;
  };

  // a click: pin the position (on axis), or unpin it when it is the pinned one
  Viewer.prototype.pinFocus = function (pos, axis) {
    if (this.pinned && this.focus === pos && this.focusAxis === axis) { this.pinned = false; return; }
    this.pinned = true;
    this.setFocus(pos, axis);
  };

  Viewer.prototype.setFocus = function (pos, axis) {
    this.focus = pos;
    this.focusAxis = axis || "tokens";
    this.root.dataset.focus = String(pos);
    this.root.dataset.focusAxis = this.focusAxis;
    if (this.current && this.root.dataset.ready === "1") { this.applyFocus(pos); this.drawMatrix(); }
  };

  Viewer.prototype.clearFocus = function (unpin) {
    if (unpin) this.pinned = false;
    this.focus = null;
    delete this.root.dataset.focus;
    delete this.root.dataset.focusAxis;
    this.paintTokens(null, null);
    this.paintTokens(null, null, "target");
    this.focusLine.textContent = "Hover over a token to see what it attends to and what attends to it.";
    if (this.current) this.drawMatrix();
    this.drawOverlay();  // image.js: an image's heat goes with the focus
    this.drawFrames();  // audio.js: so does a recording's
  };

  // the open matrix through the focus: row, the focused query's weights over the key axis; col, every query's weight
  // on the focused key; each null where the focus is not on that axis
  Viewer.prototype.focusWeights = function () {
    var p = this.current, pos = this.focus, out = { row: null, col: null, axes: p ? p.axes : ["tokens", "tokens"] };
    if (!p || pos === null) return out;
    var i;
    if (p.axes[0] === this.focusAxis && pos < p.n) {
      out.row = new Float64Array(p.m);
      for (i = 0; i < p.m; i++) out.row[i] = p.value(pos, i);
    }
    if (p.axes[1] === this.focusAxis && pos < p.m) {
      out.col = new Float64Array(p.n);
      for (i = 0; i < p.n; i++) out.col[i] = p.value(i, pos);
    }
    return out;
  };

  // each token's highlight: to (blue), the focused position's weight on it; from (orange), its weight on the focus;
  // the tokens of axis ("tokens": the text, or a pair's source; "target": a pair's target)
  Viewer.prototype.paintTokens = function (to, from, axis) {
    axis = axis || "tokens";
    var tokens = (axis === "target" ? this.targetTokens : this.tokens) || [];
    var maxTo = 0, maxFrom = 0, j, focused = this.focusAxis === axis ? this.focus : null;
    for (j = 0; j < tokens.length; j++) {
      if (to && to[j] > maxTo) maxTo = to[j];
      if (from && from[j] > maxFrom) maxFrom = from[j];
    }
    for (j = 0; j < tokens.length; j++) {
      var s = tokens[j], a = to && maxTo > 0 ? to[j] / maxTo : 0, b = from && maxFrom > 0 ? from[j] / maxFrom : 0;
      if (to) s.dataset.to = String(to[j]); else s.removeAttribute("data-to");
      if (from) s.dataset.from = String(from[j]); else s.removeAttribute("data-from");
      s.style.backgroundColor = a > 0.004 ? "rgba(" + BLUE.join(",") + "," + (0.08 + 0.72 * a).toFixed(3) + ")" : "";
      s.style.boxShadow = b > 0.004 ? "inset 0 -4px 0 rgba(" + ORANGE.join(",") + "," + (0.15 + 0.85 * b).toFixed(3) + ")" : "";
      s.classList.toggle("hv-focused", j === focused);
      if (to || from) {
        s.title = (to ? "weight from the hovered position: " + fmtWeight(to[j]) : "") + (to && from ? "\n" : "") +
          (from ? "weight to the hovered position: " + fmtWeight(from[j]) : "");
      } else {
        s.removeAttribute("title");
      }
    }
  };

  Viewer.prototype.applyFocus = function (pos) {
    var w = this.focusWeights(), ax = w.axes;
    if (!w.row && !w.col) return;
    this.paintTokens(ax[1] === "tokens" ? w.row : null, ax[0] === "tokens" ? w.col : null);
    if (this.data.items[this.item].target) {
      this.paintTokens(ax[1] === "target" ? w.row : null, ax[0] === "target" ? w.col : null, "target");
    }
    this.focusLine.textContent = "";
    var who = el("strong", null, "\u201C" + this.axisLabels(this.focusAxis)[pos] + "\u201D");
    this.focusLine.appendChild(who);
    var where = this.focusAxis === "frames" ? "frame " : this.focusAxis === "target" ? "target position " : "position ";
    this.focusLine.appendChild(el("span", "hv-muted", " (" + where + pos + (this.pinned ? ", pinned" : "") + ")"));
    if (w.row) this.focusLine.appendChild(this.topList(" attends most to ", w.row, "hv-to", this.axisLabels(ax[1])));
    if (w.col) this.focusLine.appendChild(this.topList((w.row ? " \u00B7 " : " ") + "attended most by ", w.col,
      "hv-from", this.axisLabels(ax[0])));
    this.drawOverlay();
    this.drawFrames();
  };

  Viewer.prototype.topList = function (lead, values, cls, labels) {
    var order = [];
    for (var i = 0; i < values.length; i++) order.push(i);
    order.sort(function (a, b) { return values[b] - values[a]; });
    var span = el("span");
    span.appendChild(el("span", null, lead));
    var shown = order.slice(0, 4).filter(function (i) { return values[i] > 0; });
    if (!shown.length) span.appendChild(el("span", "hv-muted", "nothing (no later token sees it)"));
    shown.forEach(function (i, k) {
      var chip = el("span", "hv-chip " + cls, labels[i] + " " + fmtWeight(values[i]));
      span.appendChild(chip);
      if (k < shown.length - 1) span.appendChild(document.createTextNode(" "));
    });
    return span;
  };
})();
