// test_server.mjs — `moet serve` driven by real clients over loopback: curl, the official `openai` npm package,
// lm-evaluation-harness's local-completions log-likelihood payload (checked against `moet perplexity`), 16
// concurrent streams (checked against the same requests one at a time), every bad-input case of the issue, client
// disconnects, and SIGTERM draining. usage: node test_server.mjs MOET MODEL_DIR TEXT_FILE
import { spawn, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

const [moet, modelDir, textFile] = process.argv.slice(2);
if (!moet || !modelDir || !textFile) {
  console.error("usage: node test_server.mjs MOET MODEL_DIR TEXT_FILE");
  process.exit(2);
}
let OpenAI;
try {
  OpenAI = (await import("openai")).default;
} catch {
  console.error("SKIP: the openai npm package is not installed (cd tests/server && npm ci)");
  process.exit(77);
}

const slow = process.env.MOET_SLOW === "1"; // sanitizer builds: fewer and shorter generations
let failures = 0;
function check(cond, what) {
  if (cond) console.error(`ok   ${what}`);
  else { failures++; console.error(`FAIL ${what}`); }
}

async function startServer(args) {
  const proc = spawn(moet, ["serve", "-m", modelDir, "--port", "0", "-t", "2", ...args], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("server did not start:\n" + log)), 60000);
    proc.stderr.on("data", (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && /ready:/.test(log)) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on("exit", (code) => reject(new Error(`server exited (${code}):\n${log}`)));
  });
  const exited = new Promise((resolve) => proc.on("exit", (code, sig) => resolve({ code, sig })));
  return { proc, port, base: `http://127.0.0.1:${port}`, exited, log: () => log };
}

async function stop(srv) {
  srv.proc.kill("SIGTERM");
  return srv.exited;
}

async function post(base, path, body, headers = {}) {
  const r = await fetch(base + path, {
    method: "POST", headers: { "Content-Type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, json, text };
}

function isOpenAIError(r, status, param) {
  const e = r.json && r.json.error;
  return r.status === status && e && typeof e.message === "string" && typeof e.type === "string" &&
    "param" in e && "code" in e && (param === undefined || e.param === param);
}

function curl(args) {
  return execFileSync("curl", ["-sS", ...args], { encoding: "utf8" });
}

const N = slow ? 6 : 16;         // generated tokens per request in the comparisons
const srv = await startServer(["--max-seqs", "4", "--ctx", "512", "--queue", "64"]);
const client = new OpenAI({ baseURL: srv.base + "/v1", apiKey: "unused" });
try {
  // ---- curl --------------------------------------------------------------------------------------------
  check(JSON.parse(curl([srv.base + "/health"])).status === "ok", "curl /health is ok");
  const models = JSON.parse(curl([srv.base + "/v1/models"]));
  check(models.object === "list" && models.data[0].id === "moe-mini-a", "curl /v1/models lists moe-mini-a");
  const sse = curl(["-N", srv.base + "/v1/completions", "-H", "Content-Type: application/json", "-d",
    JSON.stringify({ prompt: "The history of", max_tokens: 4, temperature: 0, stream: true })]);
  const events = sse.split("\n\n").filter((e) => e.startsWith("data: "));
  check(events.length >= 2 && events[events.length - 1] === "data: [DONE]", "curl SSE stream ends with data: [DONE]");
  const whole = JSON.parse(curl([srv.base + "/v1/completions", "-d",
    JSON.stringify({ prompt: "The history of", max_tokens: 4, temperature: 0 })]));
  const streamed = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)).choices.map((c) => c.text).join("")).join("");
  check(whole.choices[0].text === streamed, "curl: streamed text equals the whole response's");

  // ---- openai client: completions, chat, streaming, usage -------------------------------------------------
  const prompt = "In the beginning";
  const ref = execFileSync(moet, ["run", "-m", modelDir, "-p", prompt, "-n", String(N), "--temp", "0", "--ignore-eos", "-t", "2"],
    { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).replace(/\n$/, "");
  const comp = await client.completions.create({ model: "moe-mini-a", prompt, max_tokens: N, temperature: 0, ignore_eos: true });
  check(comp.choices[0].text === ref, `openai completions: greedy text equals moet run's (${JSON.stringify(ref.slice(0, 40))})`);
  check(comp.usage.completion_tokens === N && comp.usage.total_tokens === comp.usage.prompt_tokens + N, "openai completions: usage adds up");

  let text = "", usage = null, chunks = 0;
  const cstream = await client.completions.create({ model: "moe-mini-a", prompt, max_tokens: N, temperature: 0, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true });
  for await (const ch of cstream) {
    chunks++;
    if (ch.choices.length) text += ch.choices[0].text;
    if (ch.usage) usage = ch.usage;
  }
  check(text === ref && chunks > 2, "openai completions stream: same text in several chunks");
  check(usage && usage.completion_tokens === N, "openai completions stream: include_usage delivers usage");

  const messages = [{ role: "system", content: "You are helpful." }, { role: "user", content: "Tell me about rivers." }];
  const chat = await client.chat.completions.create({ model: "moe-mini-a", messages, max_tokens: N, temperature: 0 });
  check(chat.choices[0].message.role === "assistant" && typeof chat.choices[0].message.content === "string",
    "openai chat: an assistant message");
  // the prompt the server built is the chat template's: its token count matches /tokenize of the same messages
  const tk = await post(srv.base, "/tokenize", { messages, add_generation_prompt: true });
  check(tk.status === 200 && chat.usage.prompt_tokens === tk.json.count, "openai chat: prompt_tokens equal /tokenize of the rendered template");
  let ctext = "", cusage = null, role = null;
  const chs = await client.chat.completions.create({ model: "moe-mini-a", messages, max_tokens: N, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  for await (const ch of chs) {
    if (ch.choices.length) {
      if (ch.choices[0].delta.role) role = ch.choices[0].delta.role;
      ctext += ch.choices[0].delta.content || "";
    }
    if (ch.usage) cusage = ch.usage;
  }
  check(role === "assistant" && ctext === chat.choices[0].message.content, "openai chat stream: same content as the whole response");
  check(cusage && cusage.total_tokens === chat.usage.total_tokens, "openai chat stream: usage equals the whole response's");

  // tools reach the template and switch on reply parsing: the test model does not call tools, so the reply must
  // come back as the same plain content whole and streamed (the parser itself: tests/test_tools.c)
  const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
  const tw = await client.chat.completions.create({ model: "moe-mini-a", messages, tools, max_tokens: N, temperature: 0 });
  const tm = tw.choices[0].message;
  check(typeof tm.content === "string" && !tm.tool_calls && ["stop", "length"].includes(tw.choices[0].finish_reason),
    "openai chat with tools: a plain reply stays content");
  let ttext = "", tcalls = 0;
  const tst = await client.chat.completions.create({ model: "moe-mini-a", messages, tools, max_tokens: N, temperature: 0, stream: true });
  for await (const ch of tst) {
    if (!ch.choices.length) continue;
    ttext += ch.choices[0].delta.content || "";
    if (ch.choices[0].delta.tool_calls) tcalls++;
  }
  check(ttext === tm.content && tcalls === 0, "openai chat stream with tools: same content as the whole response");

  const lp = await client.chat.completions.create({ model: "moe-mini-a", messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
  const lc = lp.choices[0].logprobs.content;
  check(lc.length >= 1 && lc[0].top_logprobs.length === 2 && lc[0].logprob <= 0 && lc[0].logprob === lc[0].top_logprobs[0].logprob,
    "openai chat logprobs: greedy token is the top alternative");
  try {
    await client.completions.create({ model: "moe-mini-a", prompt: "x", temperature: 7 });
    check(false, "openai client: temperature 7 is refused");
  } catch (e) {
    check(e.status === 400 && /temperature/.test(e.message), "openai client: temperature 7 -> BadRequestError 400");
  }
  const stopAt = ref.slice(6, 9);
  const st = await client.completions.create({ model: "moe-mini-a", prompt, max_tokens: N, temperature: 0, stop: [stopAt] });
  check(st.choices[0].finish_reason === "stop" && st.choices[0].text === ref.slice(0, ref.indexOf(stopAt)),
    `stop string ${JSON.stringify(stopAt)} cuts the text before it`);
  const multi = await client.completions.create({ model: "moe-mini-a", prompt: ["a", "b"], n: 2, max_tokens: 2, temperature: 0.8, seed: 5 });
  check(multi.choices.length === 4 && multi.choices.map((c) => c.index).join() === "0,1,2,3", "two prompts × n=2: four choices indexed 0..3");

  // ---- lm-evaluation-harness log-likelihood payload vs moet perplexity ------------------------------------
  const ctx = 128, chunksN = 2;
  const ppl = JSON.parse(execFileSync(moet, ["perplexity", "-m", modelDir, "-f", textFile, "--ctx", String(ctx), "--chunks",
    String(chunksN), "--json", "-t", "2"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }));
  const all = (await post(srv.base, "/tokenize", { prompt: readFileSync(textFile, "utf8") })).json.tokens;
  const windows = [];
  for (let w = 0; w < chunksN; w++) windows.push(all.slice(w * ctx, (w + 1) * ctx));
  const le = await post(srv.base, "/v1/completions", { model: "moe-mini-a", prompt: windows, max_tokens: 1, temperature: 0,
    logprobs: 1, echo: true, seed: 1234 });
  let nll = 0, count = 0, greedyOk = true;
  for (const ch of le.json.choices.sort((a, b) => a.index - b.index)) {
    const tl = ch.logprobs.token_logprobs, top = ch.logprobs.top_logprobs;
    check(tl.length === ctx + 1 && tl[0] === null && top[0] === null, `lm-eval: choice ${ch.index}: ${ctx} echoed + 1 generated logprobs, the first null`);
    for (let i = 1; i < ctx; i++) {
      nll -= tl[i];
      count++;
      greedyOk &&= Math.max(...Object.values(top[i])) >= tl[i];
    }
  }
  const pplServer = Math.exp(nll / count);
  check(count === ppl.tokens && Math.abs(pplServer - ppl.ppl) / ppl.ppl < 1e-4,
    `lm-eval: echo logprobs give PPL ${pplServer.toFixed(6)} over ${count} tokens; moet perplexity: ${ppl.ppl} over ${ppl.tokens}`);
  check(greedyOk, "lm-eval: every top_logprobs holds at least the token's own logprob (is_greedy works)");

  // ---- 16 concurrent greedy streams equal the same requests one at a time ----------------------------------
  const prompts = Array.from({ length: 16 }, (_, i) => `Chapter ${i + 1}. The`);
  const one = async (p) => {
    let t = "";
    const s = await client.completions.create({ model: "moe-mini-a", prompt: p, max_tokens: N, temperature: 0, stream: true, ignore_eos: true });
    for await (const ch of s) if (ch.choices.length) t += ch.choices[0].text;
    return t;
  };
  const seq = [];
  for (const p of prompts) seq.push(await one(p));
  const par = await Promise.all(prompts.map(one));
  check(par.every((t, i) => t === seq[i]) && new Set(seq).size > 1, "16 concurrent streams (4 running, 12 queued) equal the sequential runs");

  // ---- bad input: OpenAI-shaped errors, nothing crashes ----------------------------------------------------
  const C = "/v1/completions", CH = "/v1/chat/completions";
  check(isOpenAIError(await post(srv.base, C, "{not json"), 400), "malformed JSON -> 400");
  check(isOpenAIError(await post(srv.base, C, "[1, 2]"), 400), "a JSON array body -> 400");
  check(isOpenAIError(await post(srv.base, C, { prompt: "x", max_tokens: "ten" }), 400, "max_tokens"), "max_tokens as a string -> 400 naming it");
  check(isOpenAIError(await post(srv.base, C, { prompt: 42 }), 400, "prompt"), "prompt as a number -> 400");
  check(isOpenAIError(await post(srv.base, C, { prompt: [1, 999999] }), 400, "prompt"), "a token id past the vocab -> 400");
  check(isOpenAIError(await post(srv.base, C, { prompt: "x", n: 1000 }), 400, "n"), "n = 1000 -> 400");
  check(isOpenAIError(await post(srv.base, C, { prompt: "x", logit_bias: { 1: 5 } }), 400, "logit_bias"), "logit_bias (unimplemented) is refused, not ignored");
  check(isOpenAIError(await post(srv.base, C, { prompt: "x", stream: "yes" }), 400, "stream"), "stream as a string -> 400");
  check((await post(srv.base, C, { prompt: "x", max_tokens: 1, user: "u", metadata: { k: "v" }, store: false })).status === 200,
    "harmless extra fields (user, metadata, store) are accepted");
  check(isOpenAIError(await post(srv.base, C, '{"prompt": "x", "prompt": "y"}'), 400), "duplicate keys -> 400");
  check(isOpenAIError(await post(srv.base, C, { model: "gpt-4", prompt: "x" }), 404, "model"), "an unknown model -> 404");
  check(isOpenAIError(await post(srv.base, CH, { messages: "hi" }), 400, "messages"), "messages as a string -> 400");
  check(isOpenAIError(await post(srv.base, CH, { messages: [{ role: "wizard", content: "x" }] }), 400, "messages"), "an unknown role -> 400");
  check(isOpenAIError(await post(srv.base, CH, { messages: [{ role: "user", content: [{ type: "image_url" }] }] }), 400), "an image part -> 400");
  const long = Array.from({ length: 600 }, (_, i) => 100 + (i % 50));
  const cl = await post(srv.base, C, { prompt: long, max_tokens: 1 });
  check(isOpenAIError(cl, 400) && cl.json.error.code === "context_length_exceeded", "a prompt past the 512-token context -> 400 context_length_exceeded");
  check(isOpenAIError(await post(srv.base, C, { prompt: long.slice(0, 500), max_tokens: 100 }), 400), "prompt + max_tokens past the context -> 400");
  check(isOpenAIError(await post(srv.base, "/v1/nothing", {}), 404), "an unknown path -> 404");
  const big = await post(srv.base, C, { prompt: "x".repeat(9 << 20) });
  check(isOpenAIError(big, 413), "a 9 MiB body -> 413");

  // ---- a client that disconnects stops its sequence --------------------------------------------------------
  const metric = async (name) => {
    const t = await (await fetch(srv.base + "/metrics")).text();
    const m = t.match(new RegExp("^" + name.replace(/[{}"]/g, (c) => "\\" + c) + " (\\d+)", "m"));
    return m ? Number(m[1]) : NaN;
  };
  const before = await metric('moet_sequences_finished_total{reason="cancelled"}');
  const ac = new AbortController();
  const r = await fetch(srv.base + C, { method: "POST", signal: ac.signal, headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "Once", max_tokens: 400, temperature: 0, stream: true, ignore_eos: true }) });
  const reader = r.body.getReader();
  await reader.read();
  await reader.read();
  ac.abort();
  let after = before;
  for (let i = 0; i < 200 && after === before; i++) {
    await new Promise((res) => setTimeout(res, 50));
    after = await metric('moet_sequences_finished_total{reason="cancelled"}');
  }
  check(after === before + 1, "an aborted stream cancels its sequence (metrics count it)");
  const t0 = Date.now();
  const quick = await post(srv.base, C, { prompt: "x", max_tokens: 2 });
  check(quick.status === 200 && Date.now() - t0 < 20000, "the server answers right after the disconnect");

  // ---- /tokenize, /detokenize, /metrics -------------------------------------------------------------------
  const tok = await post(srv.base, "/tokenize", { prompt: "Hello world" });
  const de = await post(srv.base, "/detokenize", { tokens: tok.json.tokens });
  check(tok.status === 200 && de.json.prompt === "Hello world", "/tokenize then /detokenize round-trips");
  check(isOpenAIError(await post(srv.base, "/detokenize", { tokens: [-1] }), 400), "/detokenize of a bad id -> 400");
  const mt = await (await fetch(srv.base + "/metrics")).text();
  check(/moet_time_to_first_token_seconds_count [1-9]/.test(mt) && /moet_inter_token_latency_seconds_bucket/.test(mt) &&
    /moet_generation_tokens_total [1-9]/.test(mt) && /moet_queue_depth 0/.test(mt), "/metrics has TTFT/ITL histograms, token counters, queue depth");
} finally {
  const ex = await stop(srv);
  check(ex.code === 0, `SIGTERM: the server exits 0 (got ${ex.code} ${ex.sig || ""})`);
  if (ex.code !== 0) console.error(srv.log().slice(-3000));
}

// ---- API keys, a full queue, SIGTERM with a request in flight ---------------------------------------------
{
  const s2 = await startServer(["--api-key", "sekret", "--max-seqs", "1", "--queue", "1", "--ctx", "512"]);
  const C = "/v1/completions";
  check(isOpenAIError(await post(s2.base, C, { prompt: "x" }), 401), "no API key -> 401");
  check(isOpenAIError(await post(s2.base, C, { prompt: "x" }, { Authorization: "Bearer wrong" }), 401), "a wrong API key -> 401");
  check((await post(s2.base, C, { prompt: "x", max_tokens: 1 }, { Authorization: "Bearer sekret" })).status === 200, "the right API key -> 200");
  const auth = { Authorization: "Bearer sekret" };
  const burst = await Promise.all(Array.from({ length: 6 }, () =>
    post(s2.base, C, { prompt: "Once", max_tokens: slow ? 20 : 60, ignore_eos: true }, auth)));
  const codes = burst.map((r) => r.status);
  check(codes.includes(429) && codes.includes(200) && codes.every((c) => c === 200 || c === 429) &&
    burst.filter((r) => r.status === 429).every((r) => isOpenAIError(r, 429)), `a full queue answers 429 (${codes.join(",")})`);
  const inflight = post(s2.base, C, { prompt: "Once", max_tokens: slow ? 20 : 60, ignore_eos: true }, auth);
  await new Promise((res) => setTimeout(res, 150));
  s2.proc.kill("SIGTERM");
  const done = await inflight;
  const ex = await s2.exited;
  check(done.status === 200 && done.json.usage.completion_tokens === (slow ? 20 : 60), "SIGTERM drains: the in-flight request completes");
  check(ex.code === 0, `SIGTERM drains: then exit 0 (got ${ex.code})`);
}

// ---- a paged KV pool smaller than the slots: requests wait for blocks, a prompt past the pool is refused -----
{
  const s3 = await startServer(["--max-seqs", "4", "--ctx", "128", "--kv-tokens", "32", "--kv-block", "16"]);
  const C = "/v1/completions";
  try {
    // each sequence below takes 5-6 prompt + 8 generated tokens: one 16-token block, so two run at a time
    const ps = ["Once upon", "The cat", "In the", "A long time"];
    const gen = async (p) => (await post(s3.base, C, { prompt: p, max_tokens: 8, temperature: 0, ignore_eos: true })).json;
    const seq3 = [];
    for (const p of ps) seq3.push(await gen(p));
    const par3 = await Promise.all(ps.map(gen));
    check(par3.every((r, i) => r.choices[0].text === seq3[i].choices[0].text && r.usage.completion_tokens === 8),
      "4 concurrent requests, KV blocks for 2: the others wait for blocks and equal the sequential runs");
    // two sequences that outgrow the pool while decoding (5 + 20 tokens each: two blocks, the pool has two): both
    // are preempted when they need their second block, then recomputed one after the other, and finish whole
    const gen2 = async (p) => (await post(s3.base, C, { prompt: p, max_tokens: 20, temperature: 0, ignore_eos: true })).json;
    const ps2 = ["Once upon", "The cat"];
    const seq2 = [];
    for (const p of ps2) seq2.push(await gen2(p));
    const par2 = await Promise.all(ps2.map(gen2));
    check(par2.every((r, i) => r.usage.completion_tokens === 20 && r.choices[0].finish_reason === "length" &&
      r.choices[0].text === seq2[i].choices[0].text),
      `sequences preempted when the pool runs out finish whole, as run alone (${par2.map((r) => r.usage.completion_tokens)})`);
    const mt3 = await (await fetch(s3.base + "/metrics")).text();
    check(/moet_preemptions_total [1-9]/.test(mt3), "/metrics counts the preemptions");
    // the prefix cache: a 20-token prompt sent again shares its first block (16 tokens) instead of computing it
    const pre = Array.from({ length: 20 }, (_, i) => 200 + 7 * i);
    const hits = async () => +((await (await fetch(s3.base + "/metrics")).text()).match(/moet_prefix_cache_hit_tokens_total (\d+)/) || [0, -1])[1];
    const h0 = await hits();
    const r1 = (await post(s3.base, C, { prompt: pre, max_tokens: 6, temperature: 0, ignore_eos: true })).json;
    const r2 = (await post(s3.base, C, { prompt: pre, max_tokens: 6, temperature: 0, ignore_eos: true })).json;
    const h1 = await hits();
    check(h1 - h0 >= 16 && r1.choices[0].text === r2.choices[0].text,
      `a repeated prompt shares its cached prefix block (${h1 - h0} tokens) and gives the same text`);
    const big = await post(s3.base, C, { prompt: Array.from({ length: 40 }, (_, i) => 100 + i), max_tokens: 1 });
    check(isOpenAIError(big, 400) && /KV cache/.test(big.json.error.message), `a prompt needing more KV than the pool -> 400 (${big.status})`);
    check((await post(s3.base, C, { prompt: "x", max_tokens: 2 })).status === 200, "the server goes on after it");
  } finally {
    const ex = await stop(s3);
    check(ex.code === 0, `paged-pool server exits 0 (got ${ex.code})`);
  }
}

if (failures) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.error("ok");
