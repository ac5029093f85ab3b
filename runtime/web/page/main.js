// duet's chat page: loads the wasm runtime (/pkg/), lists the models `duet web` serves
// (/models), fetches the chosen one and generates on the page's WebGPU adapter, a token at a
// time, continuing plain text or, with "Chat template", a conversation rendered by the
// model's template. A model (served, or a local file) is streamed into the runtime as it
// downloads: the tab holds about one layer of the file at a time, never the whole file.
// A query string runs one prompt at once — `?model=N&prompt=TEXT&max=K`, `&chat=1` for a
// chat turn, `&cache=K/V` for the K/V cache, `&ctx=N` for the context's length, `&temp=T`
// for the temperature (0, greedy, unless given),
// `&maxBinding=BYTES` to bind no more at once than a smaller adapter would — and
// `window.duetResult` is then a promise of { tokens, text, adapter, promptTokens, wasmBytes }, and
// `window.duetRun(model, prompt, max, chat, settings)` runs another in the same tab: the test
// (tests/web_browser.rs) uses both over DevTools.
import init, { load } from "/pkg/duet_web.js";

const $ = (id) => document.getElementById(id);
let duet = null;
// The runtime's exports (its memory's size goes into a result: what the tab holds).
let wasm = null;
// Loading or replying: the buttons wait until it is done.
let busy = false;
// The conversation so far (chat mode): { role, content } in order.
let history = [];

function status(text, error = false) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
  if (error) console.error(text);
}

function turn(cls, text) {
  const d = document.createElement("div");
  d.className = "turn " + cls;
  d.textContent = text;
  $("log").append(d);
  return d;
}

// Set once the runtime has trapped (a bug, or a model's chat template past its memory
// budget): its state is gone, and only a reload brings it back.
let stopped = false;

// The reader of the file being loaded (cancelled when the runtime stops mid-load).
let loading = null;

function setBusy(b) {
  busy = b;
  $("load").disabled = $("file").disabled = b || stopped;
  $("send").disabled = $("prompt").disabled = b || stopped || !duet;
}

// Shows an error; a trap of the runtime (WebAssembly.RuntimeError) stops the page's runtime.
function failed(e) {
  if (e instanceof WebAssembly.RuntimeError) {
    stopped = true;
    duet = null;
    // A load the trap interrupted never finishes: its download is not wanted.
    if (loading) loading.cancel().catch(() => {});
    status(`The runtime stopped (${e.message}; the console says why): reload the page to go on.`, true);
    setBusy(busy);
  } else {
    status(String(e), true);
  }
}

const MiB = 1048576;
// Page settings for tests (the query string); 0: the model's context, the adapter's limits.
let nCtx = 0;
let maxBinding = 0;

// Loads a model from `reader` (a ReadableStream's reader of `size` bytes) into the runtime,
// which takes it tensor by tensor as it arrives.
async function loadFrom(reader, size, name) {
  // The old model's GPU buffers go before the next one loads.
  if (duet) duet.free();
  duet = null;
  $("chat").disabled = true;
  $("ctx").textContent = "";
  setBusy(true);
  loading = reader;
  let got = 0;
  const read = async () => {
    const { done, value } = await reader.read();
    if (done) return undefined;
    got += value.length;
    status(`Loading ${name}: ${(got / MiB).toFixed(1)} of ${(size / MiB).toFixed(1)} MiB onto the GPU…`);
    return value;
  };
  status(`Loading ${name}…`);
  const [ck, cv] = $("cache").value.split("/");
  try {
    duet = await load(read, size, name, nCtx, ck, cv, maxBinding);
  } finally {
    // Whatever is left of a failed load's download is not wanted.
    loading = null;
    reader.cancel().catch(() => {});
  }
  $("adapter").textContent = duet.adapter();
  // The model's recommended sampling (llama.cpp's defaults where it gives none).
  const [temp, , topP] = duet.sampling();
  $("temp").value = +temp.toFixed(3);
  $("topp").value = +topP.toFixed(3);
  for (const n of duet.notes()) turn("model", "note: " + n);
  history = [];
  $("chat").disabled = !duet.can_chat();
  $("chat").checked = duet.can_chat();
  $("ctx").textContent = `context 0 / ${duet.n_ctx()} tokens`;
  status(`${name} is ready.`);
}

async function loadModel(i, name, bytes) {
  const resp = await fetch(`/models/${i}`);
  if (!resp.ok) throw new Error(`fetching ${name}: HTTP ${resp.status}`);
  const size = Number(resp.headers.get("Content-Length") || bytes);
  await loadFrom(resp.body.getReader(), size, name);
}

async function reply(prompt, max, chat) {
  const d = duet;
  // Top-k and min-p stay the model's; a new seed each reply.
  const [, topK, , minP] = d.sampling();
  d.set_sampling(Number($("temp").value), topK, Number($("topp").value), minP, (Math.random() * 2 ** 32) >>> 0);
  turn("user", prompt);
  const out = turn("model", "");
  // The conversation with this turn; kept only once the reply is complete.
  const turns = [...history, { role: "user", content: prompt }];
  // (The template renders in a synchronous call: a trap there is this call's exception.)
  const promptTokens = chat
    ? await d.start_tokens(d.chat_tokens(turns.map((m) => m.role), turns.map((m) => m.content)), max)
    : await d.start(prompt, max);
  // The prompt was taken (settings and length): it leaves the box for the log.
  if ($("prompt").value === prompt) $("prompt").value = "";
  const t0 = performance.now();
  let text = "";
  for (;;) {
    const piece = await d.next();
    if (piece === undefined) break;
    text += piece;
    out.textContent = text;
    const n = d.tokens().length;
    const s = (performance.now() - t0) / 1000;
    $("stats").textContent = `${n} tokens, ${(n / s).toFixed(1)} tokens/s`;
  }
  if (chat) history = [...turns, { role: "assistant", content: text }];
  const tokens = Array.from(d.tokens());
  $("ctx").textContent = `context ${promptTokens + tokens.length} / ${d.n_ctx()} tokens`;
  return { tokens, text, adapter: d.adapter(), promptTokens, wasmBytes: wasm.memory.buffer.byteLength };
}

async function main() {
  if (!navigator.gpu) {
    status("This browser has no WebGPU (navigator.gpu is missing): use a recent Chrome or Edge, or enable WebGPU in Firefox or Safari.", true);
    throw new Error("no WebGPU");
  }
  wasm = await init();
  const models = await (await fetch("/models")).json();
  for (const [i, m] of models.entries()) {
    const o = document.createElement("option");
    o.value = i;
    o.textContent = `${m.name} (${(m.bytes / 1048576).toFixed(1)} MiB)`;
    $("model").append(o);
  }
  const pick = () => {
    const i = Number($("model").value);
    return [i, models[i].name, models[i].bytes];
  };
  $("load").onclick = () => {
    if (busy) return;
    setBusy(true);
    loadModel(...pick())
      .catch(failed)
      .finally(() => setBusy(false));
  };
  $("ask").onsubmit = (ev) => {
    ev.preventDefault();
    const p = $("prompt").value;
    if (busy || !duet || !p) return;
    setBusy(true);
    reply(p, 256, $("chat").checked)
      .catch(failed)
      .finally(() => setBusy(false));
  };
  $("file").onchange = () => {
    const f = $("file").files[0];
    if (busy || !f) return;
    setBusy(true);
    loadFrom(f.stream().getReader(), f.size, f.name)
      .catch(failed)
      .finally(() => {
        // The same file chosen again is a change too.
        $("file").value = "";
        setBusy(false);
      });
  };
  // One prompt on model i, as the query string asks (and the test, again, in this tab);
  // `settings` may change the context's length (ctx), the binding cap (maxBinding) and
  // the temperature (temp; 0, greedy, unless given).
  window.duetRun = async (i, prompt, max, chat, settings = {}) => {
    if (stopped) throw new Error("the runtime stopped: reload the page");
    if (busy) throw new Error("the page is busy");
    nCtx = settings.ctx ?? nCtx;
    maxBinding = settings.maxBinding ?? maxBinding;
    $("model").value = i;
    setBusy(true);
    try {
      await loadModel(i, models[i].name, models[i].bytes);
      $("temp").value = settings.temp ?? 0;
      return await reply(prompt, max, chat);
    } catch (e) {
      failed(e);
      throw e;
    } finally {
      setBusy(false);
    }
  };
  const q = new URLSearchParams(location.search);
  nCtx = Number(q.get("ctx") || 0);
  maxBinding = Number(q.get("maxBinding") || 0);
  if (q.has("cache")) $("cache").value = q.get("cache");
  if (q.has("prompt")) {
    const temp = Number(q.get("temp") || 0);
    return await window.duetRun(Number(q.get("model") || 0), q.get("prompt"), Number(q.get("max") || 32), q.get("chat") === "1", { temp });
  }
  status(models.length ? "Choose a model and press Load." : "duet web serves no model.");
}

// A trap inside an async call of the runtime surfaces here, not at the call (whose promise
// then never settles): the page stops waiting and says so.
window.addEventListener("error", (ev) => {
  if (ev.error instanceof WebAssembly.RuntimeError) failed(ev.error);
});

window.duetResult = main().catch((e) => {
  // (duetRun has shown its own errors.)
  if ($("status").className !== "error") status(String(e), true);
  throw e;
});
window.duetResult.then(
  (r) => r && console.log(`duet: ${r.tokens.length} tokens on ${r.adapter}: ${JSON.stringify(r.tokens)}`),
  () => {},
);
