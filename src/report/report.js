"use strict";
// Sortable tables: a click on a column header sorts by its cells' data-v (numbers) or text.
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, column) {
    if (th.classList.contains("nosort")) return;
    th.addEventListener("click", function () {
      var text = th.dataset.type === "text";
      var descending = !th.classList.contains("desc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(descending ? "desc" : "asc");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var key = function (row) {
        var cell = row.cells[column];
        return text ? cell.textContent : parseFloat(cell.dataset.v || "0");
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var order = text ? x.localeCompare(y) : x - y;
        return descending ? -order : order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});

// Searching every flame graph at once, through each graph's own script (inferno's search()): the frames it
// highlights are counted and written on each profile's section (data-highlighted) and in #search-status.
function flameWindows() {
  return Array.prototype.map.call(document.querySelectorAll("iframe.flame"), function (frame) {
    return { frame: frame, win: frame.contentWindow, doc: frame.contentDocument };
  });
}

function resetFlames() {
  flameWindows().forEach(function (f) {
    if (f.win && f.win.searching) f.win.search_prompt();
    delete f.frame.closest("section").dataset.highlighted;
  });
  document.getElementById("search-status").textContent = "";
}

function searchFlames(term) {
  resetFlames();
  var total = 0, graphs = 0;
  flameWindows().forEach(function (f) {
    if (!f.win || typeof f.win.search !== "function") return;
    f.win.search(term);
    var highlighted = 0;
    f.doc.querySelectorAll("#frames rect").forEach(function (rect) {
      if (rect.getAttribute("fill") === f.win.searchcolor) highlighted++;
    });
    f.frame.closest("section").dataset.highlighted = highlighted;
    total += highlighted;
    graphs++;
  });
  var status = document.getElementById("search-status");
  status.dataset.term = term;
  status.dataset.highlighted = total;
  status.textContent = total + " frames highlighted in " + graphs + " flame graphs";
}

document.getElementById("flame-search-form").addEventListener("submit", function (e) {
  e.preventDefault();
  var term = document.getElementById("flame-search").value;
  if (term) searchFlames(term); else resetFlames();
});
document.getElementById("flame-reset").addEventListener("click", resetFlames);

// A link to the report can carry a search: report.html#search=do_command
window.addEventListener("load", function () {
  var m = /^#search=(.+)$/.exec(location.hash);
  if (m) {
    var term = decodeURIComponent(m[1]);
    document.getElementById("flame-search").value = term;
    searchFlames(term);
  }
});

// A statement's link to its own flame graphs opens them.
document.querySelectorAll("a.graphs").forEach(function (a) {
  a.addEventListener("click", function () {
    var graphs = document.querySelector(a.getAttribute("href"));
    if (graphs) graphs.open = true;
  });
});
