// duet's chat page: loads the wasm runtime (/pkg/), lists the models `duet web` serves
// (/models), fetches the chosen one and generates on the page's WebGPU adapter, a token at a
// time, continuing plain text or, with "Chat template", a conversation rendered by the
// model's template. A query string runs one prompt at once — `?model=N&prompt=TEXT&max=K`,
// `&chat=1` for a chat turn, `&cache=K/V` for the K/V cache — and `window.duetResult` is then a promise of { tokens, text,
// adapter, promptTokens }: the test (tests/web_browser.rs) reads it over DevTools.
import init, { load } from "/pkg/duet_web.js";

const $ = (id) => document.getElementById(id);
let duet = null;
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

function setBusy(b) {
  busy = b;
  $("load").disabled = $("send").disabled = b;
}

async function loadModel(i, name) {
  // The old model's GPU buffers and file go before the next one loads.
  if (duet) duet.free();
  duet = null;
  $("prompt").disabled = $("send").disabled = true;
  status(`Fetching ${name}…`);
  const resp = await fetch(`/models/${i}`);
  if (!resp.ok) throw new Error(`fetching ${name}: HTTP ${resp.status}`);
  const bytes = new Uint8Array(await resp.arrayBuffer());
  status(`Loading ${name} (${(bytes.length / 1048576).toFixed(1)} MiB) onto the GPU…`);
  const [ck, cv] = $("cache").value.split("/");
  duet = await load(bytes, name, 0, ck, cv);
  $("adapter").textContent = duet.adapter();
  for (const n of duet.notes()) turn("model", "note: " + n);
  history = [];
  $("chat").disabled = !duet.can_chat();
  $("chat").checked = duet.can_chat();
  $("ctx").textContent = `context 0 / ${duet.n_ctx()} tokens`;
  $("prompt").disabled = $("send").disabled = false;
  status(`${name} is ready.`);
}

async function reply(prompt, max, chat) {
  const d = duet;
  turn("user", prompt);
  const out = turn("model", "");
  // The conversation with this turn; kept only once the reply is complete.
  const turns = [...history, { role: "user", content: prompt }];
  const promptTokens = chat
    ? await d.start_chat(turns.map((m) => m.role), turns.map((m) => m.content), max)
    : await d.start(prompt, max);
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
  return { tokens, text, adapter: d.adapter(), promptTokens };
}

async function main() {
  if (!navigator.gpu) {
    status("This browser has no WebGPU (navigator.gpu is missing): use a recent Chrome or Edge, or enable WebGPU in Firefox or Safari.", true);
    throw new Error("no WebGPU");
  }
  await init();
  const models = await (await fetch("/models")).json();
  for (const [i, m] of models.entries()) {
    const o = document.createElement("option");
    o.value = i;
    o.textContent = `${m.name} (${(m.bytes / 1048576).toFixed(1)} MiB)`;
    $("model").append(o);
  }
  const pick = () => [Number($("model").value), models[Number($("model").value)].name];
  $("load").onclick = () => {
    if (busy) return;
    setBusy(true);
    loadModel(...pick())
      .catch((e) => status(String(e), true))
      .finally(() => setBusy(false));
  };
  $("ask").onsubmit = (ev) => {
    ev.preventDefault();
    const p = $("prompt").value;
    if (busy || !duet || !p) return;
    setBusy(true);
    $("prompt").value = "";
    reply(p, 256, $("chat").checked)
      .catch((e) => status(String(e), true))
      .finally(() => setBusy(false));
  };
  const q = new URLSearchParams(location.search);
  if (q.has("prompt")) {
    const i = Number(q.get("model") || 0);
    $("model").value = i;
    if (q.has("cache")) $("cache").value = q.get("cache");
    setBusy(true);
    try {
      await loadModel(i, models[i].name);
      return await reply(q.get("prompt"), Number(q.get("max") || 32), q.get("chat") === "1");
    } finally {
      setBusy(false);
    }
  }
  status(models.length ? "Choose a model and press Load." : "duet web serves no model.");
}

window.duetResult = main().catch((e) => {
  status(String(e), true);
  throw e;
});
window.duetResult.then((r) => r && console.log(`duet: ${r.tokens.length} tokens on ${r.adapter}: ${JSON.stringify(r.tokens)}`));
