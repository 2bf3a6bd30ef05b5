// Plain JS for the live parts of the admin UI: the streamed text of a job and page refreshes.
"use strict";

function followJob(output) {
  const state = document.getElementById("state");
  const tokens = document.getElementById("tokens");
  const progress = document.getElementById("progress");
  const error = document.getElementById("error");
  const cancel = document.getElementById("cancel-form");
  const source = new EventSource(output.dataset.stream);
  let count = 0;
  source.addEventListener("token", (e) => {
    output.textContent += JSON.parse(e.data).text;
    count += 1;
    if (tokens) tokens.textContent = count;
    if (progress) progress.value = count;
    if (state && state.textContent === "queued") state.textContent = "running";
  });
  const finish = (text) => {
    source.close();
    if (state) state.textContent = text;
    if (cancel) cancel.remove();
    output.classList.add("done");
  };
  source.addEventListener("end", (e) => {
    const data = JSON.parse(e.data);
    showFigures(data.usage, data.timings);
    finish(data.finish_reason === "cancelled" ? "cancelled" : "finished");
  });
  source.addEventListener("error", (e) => {
    if (e.data) {  // our error record; a bare "error" is the connection, which EventSource retries
      error.textContent = JSON.parse(e.data).error;
      document.getElementById("error-row").hidden = false;
      finish("failed");
    }
  });
}

// Usage and timings from a job's end record, as the job page renders them for a finished job.
function showFigures(usage, timings) {
  const put = (id, value, digits) => {
    const cell = document.getElementById(id);
    if (cell && value !== null && value !== undefined) {
      cell.textContent = digits === undefined ? String(value) : value.toFixed(digits);
    }
  };
  if (usage) {
    put("prompt-tokens", usage.prompt_tokens);
    put("completion-tokens", usage.completion_tokens);
  }
  if (timings) {
    put("ttft", timings.time_to_first_token, 3);
    put("prompt-tps", timings.prompt_tokens_per_second, 1);
    put("generation-tps", timings.generation_tokens_per_second, 1);
  }
}

function localTimes() {
  for (const cell of document.querySelectorAll("[data-ts]")) {
    const ts = parseFloat(cell.dataset.ts);
    if (ts) cell.textContent = new Date(ts * 1000).toLocaleString();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const output = document.getElementById("output");
  if (output && output.dataset.stream) followJob(output);
  localTimes();
  const refresh = document.querySelector("[data-autorefresh]");
  if (refresh) setTimeout(() => location.reload(), 1000 * parseFloat(refresh.dataset.autorefresh));
});
