// Live updates for a run in flight: the server sends "change" (server-sent events) when the
// run moves; the summary is fetched again with htmx. No framework, no inline script.
document.addEventListener("DOMContentLoaded", () => {
  const live = document.querySelector("[data-events]");
  if (!live || !window.EventSource) return;
  const source = new EventSource(live.dataset.events);
  source.addEventListener("change", () => {
    htmx.ajax("GET", live.dataset.summary, { target: "#summary", swap: "outerHTML" });
  });
  source.addEventListener("done", () => {
    htmx.ajax("GET", live.dataset.summary, { target: "#summary", swap: "outerHTML" });
    source.close();
  });
});
