/* headlab attention viewer, part 8 of 9: an audio model's encoder frames as a strip of times, beside its decoder's
 * tokens (the token list). The open head's axes (ui.js) say what a focus reaches: on a cross-attention head a
 * hovered token's weights go to the frames, on an encoder head a hovered frame's do; either is drawn as heat over
 * the strip, each frame's cell filled with its weight relative to the largest weight on a frame. Frames beyond the
 * audio (the padding to the encoder's window) are greyed.
 *
 * Test hooks: every frame cell carries data-pos and, while a focus reaches the frames, data-to (the focused
 * position's weight on it) or data-from (its weight on the focused frame); the viewer's frameWeights holds the
 * weights drawn as heat (the focused row of the matrix shown, over the frames) and framePeak their largest; a cell's
 * alpha is MAX_ALPHA * weight / framePeak (HeadlabViewer.MAX_ALPHA, image.js).
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, el = HV.el, fmtWeight = HV.fmtWeight, ORANGE = HV.ORANGE;
  var TIMES = 100;  // a strip of at most this many frames writes each one's time in its cell; a longer one, none

  Viewer.prototype.buildFrames = function (parent) {
    if (!this.data.items.some(function (it) { return it.frames; })) return;
    var self = this, box = el("section", "hv-panel hv-frames-panel");
    box.appendChild(el("h4", null, "Audio"));
    box.appendChild(el("p", "hv-help", "The encoder's frames in time (greyed: the padding beyond the audio). On a " +
      "cross-attention head, hover over a token below: its attention over the frames, as heat (darkest = its " +
      "largest weight on a frame). On an encoder head, hover over a frame. Click to pin."));
    this.frameStrip = el("div", "hv-frames");
    this.frameStrip.addEventListener("mouseover", function (ev) {
      var f = ev.target.closest ? ev.target.closest(".hv-frame") : null;
      if (f && !self.pinned) self.setFocus(+f.dataset.pos, "frames");
    });
    this.frameStrip.addEventListener("click", function (ev) {
      var f = ev.target.closest ? ev.target.closest(".hv-frame") : null;
      if (f) self.pinFocus(+f.dataset.pos, "frames");
    });
    this.frameStrip.addEventListener("mouseleave", function () { if (!self.pinned) self.clearFocus(false); });
    box.appendChild(this.frameStrip);
    this.frameStatus = el("div", "hv-status", "\u00A0");
    box.appendChild(this.frameStatus);
    parent.appendChild(box);
    this.framesBox = box;
  };

  Viewer.prototype.renderFrames = function () {
    if (!this.framesBox) return;
    var fr = this.data.items[this.item].frames;
    this.framesBox.style.display = fr ? "" : "none";
    if (!fr) return;
    if (this.framesItem !== this.item) {
      this.framesItem = this.item;
      this.frameStrip.textContent = "";
      this.frameCells = [];
      for (var i = 0; i < fr.n; i++) {
        var cell = el("span", "hv-frame" + (i >= fr.audio ? " hv-pad" : "") + (fr.n > TIMES ? " hv-thin" : ""),
          fr.n > TIMES ? null : fr.labels[i].replace(/^frame /, ""));
        cell.dataset.pos = String(i);
        cell.title = fr.labels[i] + (i >= fr.audio ? " (padding)" : "");
        this.frameStrip.appendChild(cell);
        this.frameCells.push(cell);
      }
    }
    this.drawFrames();
  };

  Viewer.prototype.drawFrames = function () {
    var fr = this.framesBox ? this.data.items[this.item].frames : null;
    if (!fr || this.framesItem !== this.item) return;
    var w = this.focusWeights(), heat = w.axes[1] === "frames" ? w.row : null;
    var from = w.axes[0] === "frames" ? w.col : null, peak = 0, peakFrom = 0, k;
    for (k = 0; k < fr.n; k++) {
      if (heat && heat[k] > peak) peak = heat[k];
      if (from && from[k] > peakFrom) peakFrom = from[k];
    }
    var focused = this.focusAxis === "frames" ? this.focus : null;
    for (k = 0; k < fr.n; k++) {
      var cell = this.frameCells[k];
      if (heat) cell.dataset.to = String(heat[k]); else cell.removeAttribute("data-to");
      if (from) cell.dataset.from = String(from[k]); else cell.removeAttribute("data-from");
      cell.style.backgroundColor = heat && peak > 0 && heat[k] > 0 ?
        "rgba(" + HV.HEAT.join(",") + "," + (HV.MAX_ALPHA * heat[k] / peak) + ")" : "";
      cell.style.boxShadow = from && peakFrom > 0 && from[k] / peakFrom > 0.004 ?
        "inset 0 -4px 0 rgba(" + ORANGE.join(",") + "," + (0.15 + 0.85 * from[k] / peakFrom).toFixed(3) + ")" : "";
      cell.classList.toggle("hv-focused", k === focused);
    }
    this.frameWeights = heat;
    this.framePeak = heat ? peak : null;
    if (heat) {
      var padding = 0;
      for (k = fr.audio; k < fr.n; k++) padding += heat[k];
      this.frameStatus.textContent = "\u201C" + this.axisLabels(this.focusAxis)[this.focus] + "\u201D: largest weight " +
        "on a frame " + fmtWeight(peak) + "; on the padding " + fmtWeight(padding) + " in all";
    } else {
      this.frameStatus.textContent = "\u00A0";
    }
  };
})();
