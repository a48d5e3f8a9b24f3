// The job list's selection: tick jobs (or every job of the page), then act on them from the
// selection form (a GET to the bulk action's confirmation, one `ids` per job ticked: it works
// without this script too). Once every job of the page is ticked, the form offers every job
// matching the list's filter, counted by the server (/ui/matching): chosen, the buttons lead
// to the confirmation of the filter's bulk action instead, which states the count again.
(function () {
  "use strict";
  const form = document.getElementById("selection");
  if (!form) return;
  const boxes = () => [...document.querySelectorAll("input[name=ids][form=selection]")];
  const page = document.getElementById("tick-page");
  const said = document.getElementById("chosen");
  const all = document.getElementById("select-all");
  const buttons = [...form.querySelectorAll("button[name=kind]")];
  let matching = null; // the count of every job matching the filter, once asked
  let everything = false; // every matching job chosen, not only those ticked

  function plural(n) {
    return n.toLocaleString("en-US") + " job" + (n === 1 ? "" : "s");
  }

  function show() {
    const ticked = boxes().filter((b) => b.checked).length;
    const total = boxes().length;
    if (page) page.checked = total > 0 && ticked === total;
    buttons.forEach((b) => { b.disabled = !everything && ticked === 0; });
    if (everything) {
      said.textContent = "All " + plural(matching) + " matching this filter are selected.";
      all.hidden = false;
      all.textContent = "Select only the jobs ticked";
      return;
    }
    said.textContent = ticked ? plural(ticked) + " selected." : "Tick jobs to act on them.";
    const offer = ticked > 0 && ticked === total && matching !== null && matching > total;
    all.hidden = !offer;
    if (offer) all.textContent = "Select all " + plural(matching) + " matching this filter";
  }

  function count() {
    if (matching !== null) return;
    fetch(form.dataset.matching, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null))
      .then((body) => {
        if (body && typeof body.matched === "number") {
          matching = body.matched;
          show();
        }
      })
      .catch(() => {});
  }

  document.addEventListener("change", (event) => {
    const target = event.target;
    if (target === page) {
      boxes().forEach((b) => { b.checked = page.checked; });
    } else if (!(target instanceof HTMLInputElement) || target.name !== "ids") {
      return;
    }
    if (!boxes().every((b) => b.checked)) everything = false;
    else count();
    show();
  });

  all.addEventListener("click", (event) => {
    event.preventDefault();
    everything = !everything;
    if (!everything) boxes().forEach((b) => { b.checked = false; });
    show();
  });

  form.addEventListener("submit", (event) => {
    if (!everything) return;
    event.preventDefault();
    const kind = event.submitter ? event.submitter.value : "cancel";
    const filter = form.dataset.filter;
    const query = "kind=" + encodeURIComponent(kind) + (filter ? "&" + filter : "");
    window.location.assign(form.getAttribute("action") + "?" + query);
  });

  show();
})();
