// The latency page's filters: choosing a class, backend or precision rewrites the page's
// URL (so the view can be shared) and redraws its figures from their JSON with that query.
// Engine and run ids are typed, then drawn with the form's button.
(function () {
  "use strict";
  const form = document.getElementById("latency-choice");
  if (!form) return;

  form.addEventListener("change", (event) => {
    if (event.target.tagName !== "SELECT") return;
    const query = new URLSearchParams();
    for (const [name, value] of new FormData(form)) {
      if (value) query.append(name, value);
    }
    const search = query.toString() ? `?${query}` : "";
    window.history.replaceState(null, "", `${window.location.pathname}${search}`);
    for (const figure of document.querySelectorAll("[data-figure-base]")) {
      window.DeployHubFigures.draw(figure, `${figure.dataset.figureBase}${search}`);
    }
  });
})();
