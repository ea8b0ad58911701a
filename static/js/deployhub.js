// Live job views: poll each unfinished job's status and update the page in place.
(function () {
  "use strict";
  const POLL_MS = 500;

  async function fetchJSON(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(url + " answered " + response.status);
    return response.json();
  }

  function setBadge(el, status) {
    el.textContent = status.state_label;
    el.className = "badge " + status.state_color;
  }

  async function refreshResults() {
    const results = document.getElementById("results");
    if (!results) return;
    const response = await fetch(results.dataset.url, { credentials: "same-origin" });
    if (response.ok) results.innerHTML = await response.text();
  }

  // A jobs table row shows all four; a row of another table (a parity run) may show none
  // and is watched only to reload the page when its job ends.
  function updateRow(row, status) {
    const field = (name) => row.querySelector(`[data-field=${name}]`);
    if (field("state")) setBadge(field("state"), status);
    if (field("progress")) field("progress").value = status.progress;
    if (field("message")) field("message").textContent = status.message;
    if (field("attempt")) field("attempt").textContent = status.attempt;
  }

  function watchRow(row) {
    const tick = async () => {
      try {
        const status = await fetchJSON(row.dataset.live);
        updateRow(row, status);
        if (status.final) {
          row.removeAttribute("data-live");
          // A job whose kind's subscription reloads the page (the hub says so in its status)
          // adds an engine, a version, a gate or a flag: show it. A row with no state of its
          // own (a parity run's) is redrawn however its job ended. Any other job only adds a
          // results row.
          const succeeded = status.state === "succeeded";
          const showsState = row.querySelector("[data-field=state]");
          if (status.reloads_page && (succeeded || !showsState)) location.reload();
          else if (succeeded) await refreshResults();
          return;
        }
      } catch (err) { console.warn(err); }
      setTimeout(tick, POLL_MS);
    };
    tick();
  }

  function updateDetail(root, status) {
    setBadge(document.getElementById("job-state"), status);
    document.getElementById("job-progress").value = status.progress;
    document.getElementById("job-percent").textContent = Math.round(status.progress * 100) + "%";
    document.getElementById("job-message").textContent = status.message;
    document.getElementById("job-device").textContent = status.device || "—";
    document.getElementById("job-attempt").textContent = status.attempt;
    const waiting = document.getElementById("job-waiting");
    waiting.hidden = !status.waiting_notice;
    waiting.textContent = status.waiting_notice;
    const error = document.getElementById("job-error");
    error.hidden = !status.error;
    error.textContent = status.error;
    const log = document.getElementById("job-log");
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    if (log.textContent !== status.log) {
      log.textContent = status.log;
      if (atBottom) log.scrollTop = log.scrollHeight;
    }
    const cancel = document.getElementById("cancel-form");
    if (cancel) {
      cancel.hidden = status.final;
      cancel.querySelector("button").disabled = status.cancel_requested;
    }
  }

  function watchDetail(root) {
    const tick = async () => {
      try {
        const status = await fetchJSON(root.dataset.statusUrl);
        updateDetail(root, status);
        if (status.final) return;
      } catch (err) { console.warn(err); }
      setTimeout(tick, POLL_MS);
    };
    tick();
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("tr[data-live]").forEach(watchRow);
    const detail = document.getElementById("job");
    if (detail && detail.dataset.final !== "1") watchDetail(detail);
  });
})();

// Results tables: a run's details load when first opened (their link works without JavaScript).
(function () {
  "use strict";

  async function loadDetails(details) {
    const body = details.querySelector(".run-details-body");
    if (!body || body.dataset.loaded || body.dataset.loading) return;
    body.dataset.loading = "1";
    try {
      const response = await fetch(details.dataset.detailsUrl, { credentials: "same-origin" });
      // A signed-out session is sent to the sign-in page: that page is not the details.
      if (!response.ok || response.redirected) throw new Error(response.redirected ? "signed out" : response.status);
      body.innerHTML = await response.text();
      body.dataset.loaded = "1";
    } catch (err) {
      body.textContent = "Could not load the details: " + err.message + ". Try again.";  // the next open retries
    } finally {
      delete body.dataset.loading;
    }
  }

  // toggle does not bubble: listen in the capture phase, so rows the live refresh redraws work too.
  document.addEventListener("toggle", (event) => {
    const details = event.target;
    if (details.open && details.matches("details[data-details-url]")) loadDetails(details);
  }, true);
})();

// Uploads: send forms marked data-upload with XHR so a progress bar shows how far a big file got.
(function () {
  "use strict";

  function showResponse(xhr) {
    if (xhr.responseURL && new URL(xhr.responseURL).pathname !== new URL(xhr.form.action, location.href).pathname) {
      location.assign(xhr.responseURL);  // redirected: the upload was stored
      return;
    }
    if (xhr.status === 400 && showErrors(xhr.form, xhr.responseText)) return;
    document.open();
    document.write(xhr.responseText);  // another answer (a 403, a 413): show it as it came
    document.close();
  }

  // A refused upload: put every field's errors from the answer next to the fields of the form
  // on the page, so the chosen file and everything typed stay as they were.
  function showErrors(form, html) {
    const answer = new DOMParser().parseFromString(html, "text/html").querySelector("form[data-upload]");
    const slots = form.querySelectorAll("[data-errors-for]");
    if (!answer || !slots.length) return false;  // a form not drawn by _upload_form.html
    slots.forEach((slot) => {
      const fresh = answer.querySelector(`[data-errors-for="${slot.dataset.errorsFor}"]`);
      slot.innerHTML = fresh ? fresh.innerHTML : "";
    });
    form.querySelector("button[type=submit]").disabled = false;
    form.querySelector(".upload-progress").hidden = true;
    const status = form.querySelector(".upload-status");
    if (status) status.textContent = "Not stored: see the errors above. The chosen file is kept; upload again when fixed.";
    const first = form.querySelector(".field-errors:not(:empty), .form-errors:not(:empty)");
    if (first) first.scrollIntoView({ block: "center" });
    return true;
  }

  function upload(form, event) {
    event.preventDefault();
    const bar = form.querySelector(".upload-progress");
    const status = form.querySelector(".upload-status");
    const button = form.querySelector("button[type=submit]");
    const xhr = new XMLHttpRequest();
    xhr.form = form;
    xhr.open("POST", form.action || location.href);
    xhr.upload.addEventListener("progress", (e) => {
      if (!e.lengthComputable) return;
      bar.hidden = false;
      bar.value = e.loaded / e.total;
      if (status) status.textContent = Math.round(100 * e.loaded / e.total) + "% of " + (e.total / 1048576).toFixed(1) + " MB";
    });
    xhr.upload.addEventListener("load", () => { if (status) status.textContent = "uploaded; validating…"; });
    xhr.addEventListener("load", () => showResponse(xhr));
    xhr.addEventListener("error", () => {
      button.disabled = false;
      if (status) status.textContent = "The upload failed: the connection was lost. Nothing was stored.";
    });
    button.disabled = true;
    xhr.send(new FormData(form));
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("form[data-upload]").forEach((form) => {
      form.addEventListener("submit", (event) => upload(form, event));
    });
    document.querySelectorAll("[data-fill-example]").forEach((button) => {
      button.addEventListener("click", () => {
        const field = document.getElementById(button.dataset.fillExample);
        if (!field.value.trim() || confirm("Replace what is in the field with the example?")) field.value = button.dataset.example;
      });
    });
    document.querySelectorAll("[data-copy]").forEach((button) => {
      button.addEventListener("click", () => {
        const text = document.querySelector(button.dataset.copy).textContent;
        navigator.clipboard.writeText(text).then(() => { button.textContent = "copied"; });
      });
    });
  });
})();

// Compile form: a backend's default build config when the backend changes.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("select[data-defaults]").forEach((select) => {
    const defaults = JSON.parse(select.dataset.defaults);
    const config = select.form.querySelector("textarea[name=build_config]");
    select.addEventListener("change", () => {
      config.value = JSON.stringify(defaults[select.value] || {}, null, 2);
    });
  });
});

// Budget calculator (device class page): show 1000 / fps while typing; the GET form works without it.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("form[data-budget-calculator]").forEach((form) => {
    const input = form.querySelector("input[name=fps]");
    const output = form.querySelector(".budget-output");
    if (!input) return; // a batch class's calculator takes images/s: nothing to convert
    const ms = form.querySelector("input[name=ms]");
    input.addEventListener("input", () => {
      const fps = parseFloat(input.value);
      ms.value = fps > 0 ? (1000 / fps).toFixed(2) : "";
      output.textContent = fps > 0 ? "Budget " + (1000 / fps).toFixed(2) + " ms per frame" : "";
    });
    ms.addEventListener("input", () => {
      const budget = parseFloat(ms.value);
      input.value = budget > 0 ? (1000 / budget).toFixed(2) : "";
      output.textContent = budget > 0 ? (1000 / budget).toFixed(2) + " fps at most" : "";
    });
  });
  // Two builds' throughput: batch × 1000 / ms each, and how many times the first is the second.
  document.querySelectorAll("form[data-throughput-compare]").forEach((form) => {
    const value = (name) => parseFloat(form.querySelector(`input[name=${name}]`).value);
    const output = form.querySelector(".compare-output");
    const update = () => {
      const [batchA, msA, batchB, msB] = ["batch_a", "ms_a", "batch_b", "ms_b"].map(value);
      if (!(batchA > 0 && msA > 0 && batchB > 0 && msB > 0)) { output.textContent = ""; return; }
      const a = batchA * 1000 / msA, b = batchB * 1000 / msB;
      output.textContent = `batch ${batchA} at ${msA} ms = ${a.toFixed(1)} img/s, ${(a / b).toFixed(1)}× a ${msB} ms build at batch ${batchB} (${b.toFixed(1)} img/s)`;
    };
    form.addEventListener("input", update);
  });
});
