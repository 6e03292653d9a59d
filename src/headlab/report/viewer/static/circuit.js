/* headlab attention viewer, part 4 of 9: the circuit panel: the open head's strongest incoming and outgoing
 * edges, from the payload's circuit (headlab.report.viewer.circuit). A viewer without a circuit has no panel.
 *
 * Incoming edges end at the head's query or at the key/value head it reads (shared by its group with
 * grouped-query attention); outgoing ones start at it and end at a later head's q, k or v, or at the output.
 * A head at an edge's far end that the viewer shows is a button: clicking it opens that head.
 *
 * Test hooks: the panel is .hv-circuit; its lists are ol.hv-edges[data-direction=in|out]; each edge is an
 * li.hv-edge with data-label ("L0 H3 → L1 H2.k") and data-role (q, k, v or output); a head to go to is a
 * button.hv-edge-head with data-layer and data-head.
 */
(function () {
  "use strict";
  var HV = window.HeadlabViewer = window.HeadlabViewer || {};
  var Viewer = HV.Viewer, el = HV.el;

  var ROLES = [["q", "query"], ["k", "key"], ["v", "value"], ["output", "output"]];

  function fmtNumber(x) {
    if (x === null || x === undefined) return "\u2013";
    var a = Math.abs(x);
    return (a >= 1e-3 && a < 1e4) || a === 0 ? x.toPrecision(3) : x.toExponential(2);
  }

  function fmtScore(x) {  // signed: which way the edge moves the metric
    return (x > 0 ? "+" : "") + fmtNumber(x);
  }

  function fmtEffect(x) {
    if (x === null || x === undefined) return "";
    return (x > 0 ? "+" : "") + (100 * x).toFixed(1) + "%";
  }

  function roleChip(role) {
    var chip = el("span", "hv-edge-role hv-edge-" + role, role === "output" ? "out" : role);
    chip.title = role === "output" ? "into the output" : "into the receiver's " + (ROLES.filter(function (r) {
      return r[0] === role; })[0] || [role, role])[1];
    return chip;
  }

  Viewer.prototype.buildCircuit = function () {
    var c = this.data.circuit, box = el("section", "hv-panel hv-circuit");
    this.circuitTitle = el("h4");
    box.appendChild(this.circuitTitle);
    var metric = c.cleanMetric !== null && c.corruptedMetric !== null ?
      "; the metric is " + fmtNumber(c.cleanMetric) + " clean, " + fmtNumber(c.corruptedMetric) + " corrupted, and " +
      "an edge's share is its score over that gap" : "";
    box.appendChild(el("p", "hv-help", "Edge scores by " + c.method + " (" + c.edges + " edges)" + metric +
      ". Each list keeps the " + c.top + " largest |score|; click a head to open it."));
    if (c.clean !== null || c.corrupted !== null) {
      var texts = el("dl", "hv-circuit-texts");
      [["clean", c.clean], ["corrupted", c.corrupted]].forEach(function (t) {
        if (t[1] === null || t[1] === undefined) return;
        texts.appendChild(el("dt", null, t[0]));
        texts.appendChild(el("dd", null, t[1]));
      });
      box.appendChild(texts);
    }
    var legend = el("div", "hv-legend hv-circuit-legend");
    ROLES.forEach(function (r) {
      var key = el("span", "hv-circuit-key");
      key.dataset.role = r[0];
      key.appendChild(roleChip(r[0]));
      key.appendChild(el("span", null, r[0] === "output" ? "the output" : r[1]));
      legend.appendChild(key);
    });
    box.appendChild(legend);
    this.circuitBody = el("div");
    box.appendChild(this.circuitBody);
    return box;
  };

  Viewer.prototype.renderCircuit = function (lh) {
    if (this.circuitKey === this.selected) return;
    this.circuitKey = this.selected;
    var mine = this.data.circuit.heads[lh[0] + "." + lh[1]], body = this.circuitBody;
    this.circuitTitle.textContent = "Circuit: layer " + lh[0] + " \u00B7 head " + lh[1] + "'s strongest edges";
    body.textContent = "";
    if (!mine) {
      body.appendChild(el("p", "hv-help", "No edge into or out of this head has a non-zero score."));
      return;
    }
    if (mine.kvHead !== null && mine.kvHead !== undefined) {
      body.appendChild(el("p", "hv-help", "Its keys and values come from key/value head " + mine.kvHead +
        ", which heads " + mine.kvGroup.map(function (h) { return "H" + h; }).join(", ") + " share: its k and v " +
        "edges are theirs too (labelled L" + lh[0] + " H" + mine.kvHead + ".k, .v)."));
    }
    var peak = 0;
    mine["in"].concat(mine.out).forEach(function (e) { peak = Math.max(peak, Math.abs(e.score || 0)); });
    this.edgeList(body, "in", "Incoming: from the input and earlier heads, into its q, k, v", mine["in"], mine.nIn,
      peak);
    this.edgeList(body, "out", "Outgoing: to later heads' q, k, v and to the output", mine.out, mine.nOut, peak);
  };

  Viewer.prototype.edgeList = function (body, direction, title, edges, total, peak) {
    var self = this;
    var head = el("h5", "hv-edges-title", title);
    head.appendChild(el("span", "hv-muted", " (" + (edges.length < total ? "top " + edges.length + " of " : "") +
      total + ")"));
    body.appendChild(head);
    if (!edges.length) {
      body.appendChild(el("p", "hv-help", direction === "in" ? "None scored." : "None: nothing later reads it, " +
        "or no edge from it was scored."));
      return;
    }
    var list = el("ol", "hv-edges");
    list.dataset.direction = direction;
    edges.forEach(function (e) {
      var li = el("li", "hv-edge");
      li.dataset.label = e.label;
      li.dataset.role = e.role;
      li.appendChild(roleChip(e.role));
      var label = el("span", "hv-edge-label");
      var far = direction === "in" ? e.sender : e.receiver;
      var single = e.heads.length === 1 && "L" + e.heads[0][0] + " H" + e.heads[0][1] + (direction === "in" ? "" :
        "." + e.role) === far;
      var farNode = single ? self.headButton(e.heads[0], far) : el("span", null, far);
      label.appendChild(direction === "in" ? farNode : el("span", null, e.sender));
      label.appendChild(document.createTextNode(" \u2192 "));
      label.appendChild(direction === "in" ? el("span", null, e.receiver) : farNode);
      if (!single && e.heads.length) {  // a key/value head: the query heads that read it
        label.appendChild(el("span", "hv-muted", " read by "));
        e.heads.forEach(function (h) { label.appendChild(self.headButton(h, "L" + h[0] + " H" + h[1])); });
      }
      li.appendChild(label);
      var bar = el("span", "hv-edge-bar" + ((e.score || 0) < 0 ? " hv-neg" : ""));
      var fill = el("span", "hv-edge-" + e.role);
      fill.style.width = (peak > 0 ? 100 * Math.abs(e.score || 0) / peak : 0) + "%";
      bar.appendChild(fill);
      li.appendChild(bar);
      var score = el("span", "hv-edge-score", fmtScore(e.score));
      score.title = "score (the metric's change)" + (e.effect !== null ? "; " + fmtEffect(e.effect) +
        " of the clean \u2212 corrupted gap" : "");
      li.appendChild(score);
      li.appendChild(el("span", "hv-edge-effect hv-muted", fmtEffect(e.effect)));
      list.appendChild(li);
    });
    body.appendChild(list);
  };

  // a head at an edge's far end: a button that opens it when the viewer shows it, else its label
  Viewer.prototype.headButton = function (lh, text) {
    var self = this, shown = this.data.heads.some(function (h) { return h[0] === lh[0] && h[1] === lh[1]; });
    if (!shown) {
      var plain = el("span", null, text);
      plain.title = "not among the shown heads";
      return plain;
    }
    var b = el("button", "hv-edge-head", text);
    b.type = "button";
    b.dataset.layer = String(lh[0]);
    b.dataset.head = String(lh[1]);
    b.title = "open layer " + lh[0] + ", head " + lh[1];
    b.addEventListener("click", function () { self.selectHead(lh[0], lh[1]); });
    return b;
  };
})();
