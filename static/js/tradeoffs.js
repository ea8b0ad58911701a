// The trade-off explorer's filters: a change rewrites the page's URL (so the view can be
// shared) and redraws the figure from its JSON with the same query.
(function () {
  "use strict";
  const form = document.getElementById("tradeoff-filters");
  const figure = document.getElementById("tradeoff-figure");
  if (!form || !figure) return;

  form.addEventListener("change", () => {
    const query = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      if (value) query.append(name, value);
    }
    const search = query.toString() ? `?${query}` : "";
    const onItsPage = window.location.pathname === new URL(form.action).pathname;
    const pageUrl = onItsPage ? `${window.location.pathname}${search}` : `${window.location.pathname}${search}#tradeoffs`;
    window.history.replaceState(null, "", pageUrl);
    window.DeployHubFigures.draw(figure, `${form.dataset.json}${search}`);
  });
})();
