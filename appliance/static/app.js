// Plain JS for the live parts of the admin UI: the streamed text of a job and page refreshes.
"use strict";

// A stream cut short (Redis away longer than the web app waits, the web app restarting) says
// nothing of the job: the page resumes it after the last event shown, as `vkllm follow` does,
// while tries fail for up to RESUME_PATIENCE_MS.
const RESUME_PATIENCE_MS = 300000;
const RESUME_PAUSE_MS = 1000;

function followJob(output) {
  const state = document.getElementById("state");
  const tokens = document.getElementById("tokens");
  const progress = document.getElementById("progress");
  const error = document.getElementById("error");
  const cancel = document.getElementById("cancel-form");
  const reconnecting = document.getElementById("reconnecting");
  let source = null, last = null, cutSince = null, count = 0;
  const finish = (text) => {
    source.close();
    reconnecting.hidden = true;
    if (state) state.textContent = text;
    if (cancel) cancel.remove();
    output.classList.add("done");
  };
  const resume = () => {
    source.close();
    reconnecting.hidden = false;
    cutSince = cutSince || Date.now();
    if (Date.now() - cutSince > RESUME_PATIENCE_MS) {
      reconnecting.textContent = "the job's stream was cut off and could not be resumed; reload the page to try again";
    } else {
      setTimeout(connect, RESUME_PAUSE_MS);
    }
  };
  const connect = () => {
    const url = new URL(output.dataset.stream, location.href);
    if (last) url.searchParams.set("last_event_id", last);
    source = new EventSource(url);
    source.addEventListener("open", () => {
      cutSince = null;
      reconnecting.hidden = true;
    });
    source.addEventListener("token", (e) => {
      last = e.lastEventId;
      output.textContent += JSON.parse(e.data).text;
      count += 1;
      if (tokens) tokens.textContent = count;
      if (progress) progress.value = count;
      if (state && state.textContent === "queued") state.textContent = "running";
    });
    source.addEventListener("end", (e) => {
      const data = JSON.parse(e.data);
      showFigures(data.usage, data.timings);
      finish(data.finish_reason === "cancelled" ? "cancelled" : "finished");
    });
    source.addEventListener("error", (e) => {
      if (!e.data) {   // the connection: EventSource retries a dropped one itself, not a refused one (503)
        if (source.readyState === EventSource.CLOSED) resume();
        else reconnecting.hidden = false;
      } else if (JSON.parse(e.data).kind === "unavailable") {
        resume();
      } else {
        error.textContent = JSON.parse(e.data).error;
        document.getElementById("error-row").hidden = false;
        finish("failed");
      }
    });
  };
  connect();
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
