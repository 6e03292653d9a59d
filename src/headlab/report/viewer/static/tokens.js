/* headlab attention viewer, part 5 of 8: the text as tokens; focusing one shows what it attends to and what
 * attends to it (every span then carries data-to and data-from: the test hooks).
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, el = HV.el, fmtWeight = HV.fmtWeight, BLUE = HV.BLUE, ORANGE = HV.ORANGE;

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
    this.drawOverlay();  // image.js: an image's heat goes with the focus
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
    this.drawOverlay();
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
})();
