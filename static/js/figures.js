// Draw every [data-figure] element from its JSON endpoint with plotly.js (deployhub/figures/http.py).
// A click on a point opens the URL the point carries in customdata (an engine's page).
// Notes (what is missing, what to run) go to the element's [data-figure-notes] list.
(function () {
  "use strict";

  function showNotes(element, notes) {
    const list = document.getElementById(element.dataset.figureNotes || "");
    if (!list) return;
    list.replaceChildren();
    for (const note of notes || []) {
      const item = document.createElement("li");
      item.textContent = note;
      list.appendChild(item);
    }
  }

  function linkOf(point) {
    const data = point && point.customdata;
    const url = Array.isArray(data) ? data[0] : data;
    return typeof url === "string" && url.startsWith("/") && !url.startsWith("//") ? url : null;
  }

  function hasPoints(data) {
    const filled = (values) => Array.isArray(values) && values.length > 0;
    return (data || []).some((trace) => filled(trace.x) || filled(trace.y) || filled(trace.z));
  }

  // A figure with nothing to plot is a short strip, not empty axes: its notes say what to run.
  function emptyLayout(layout) {
    const empty = { ...layout, height: 90, shapes: [], annotations: [] };
    for (const key of ["xaxis", "yaxis", ...Object.keys(layout)]) {
      if (/^[xy]axis\d*$/.test(key)) empty[key] = { visible: false };
    }
    return empty;
  }

  async function draw(element, url) {
    const started = performance.now();
    element.dataset.drawn = "false";
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) {
      element.textContent = `The figure could not be loaded (HTTP ${response.status}).`;
      return;
    }
    const body = await response.json();
    const empty = !hasPoints(body.figure.data);
    const layout = empty ? emptyLayout(body.figure.layout) : body.figure.layout;
    await Plotly.react(element, empty ? [] : body.figure.data, layout, body.config);
    element.dataset.empty = empty ? "true" : "false";
    showNotes(element, body.notes);
    if (!element.dataset.clicks) {
      element.dataset.clicks = "on";
      element.on("plotly_click", (event) => {
        const url = linkOf(event.points[0]);
        if (url) window.location.assign(url);
      });
    }
    element.dataset.drawMs = (performance.now() - started).toFixed(1);
    element.dataset.drawn = "true";
  }

  window.DeployHubFigures = { draw };
  for (const element of document.querySelectorAll("[data-figure]")) {
    draw(element, element.dataset.figure);
  }
})();
