// serve_load.mjs — a bounded load test of `moet serve` on loopback, reported the way `vllm bench serve` reports:
// request throughput, output token throughput, TTFT / inter-token latency / end-to-end percentiles, failed
// requests, and the server's RSS at the start and the end of the run (it must stay flat).
//
//   node bench/serve_load.mjs --moet build/moet [-m MODEL] [--clients 8] [--seconds 30] [--max-tokens 64]
//                             [--max-seqs 4] [--json bench/results/serve-cpu.json]
// Each client loops: a streamed /v1/completions with a prompt drawn from ../shared/data/dev.txt, until the time is up.
import { spawn, execSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { hostname, cpus } from "node:os";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith("--") || a === "-m") acc.push([a.replace(/^-+/, ""), all[i + 1]]);
  return acc;
}, []));
const moet = args.moet || "build/moet";
const model = args.m || "models/moe-mini-a";
const clients = Number(args.clients || 8), seconds = Number(args.seconds || 30), maxTokens = Number(args["max-tokens"] || 64);
const maxSeqs = Number(args["max-seqs"] || 4);
const text = readFileSync(args.text || "../shared/data/dev.txt", "utf8");

const proc = spawn(moet, ["serve", "-m", model, "--port", "0", "--max-seqs", String(maxSeqs), "--queue", "1024",
  ...(args.device ? ["--device", args.device] : [])], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
const port = await new Promise((res, rej) => {
  proc.stderr.on("data", (d) => {
    log += d;
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m && /ready:/.test(log)) res(Number(m[1]));
  });
  proc.on("exit", (c) => rej(new Error(`moet serve exited ${c}: ${log}`)));
});
const base = `http://127.0.0.1:${port}`;
const rss = () => Number(readFileSync(`/proc/${proc.pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)[1]) / 1024;

async function oneRequest(prompt) {
  const t0 = performance.now();
  const r = await fetch(base + "/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0.8, stream: true, ignore_eos: true }) });
  if (r.status !== 200) throw new Error(`status ${r.status}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = "", first = null, last = null, tokens = 0, done = false;
  const itl = [];
  while (!done) {
    const { value, done: d } = await reader.read();
    if (d) break;
    buf += dec.decode(value, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (ev === "data: [DONE]") { done = true; break; }
      const j = JSON.parse(ev.slice(6));
      if (!j.choices.length) continue;
      const now = performance.now();
      if (first === null) first = now; else itl.push(now - last);
      last = now;
      tokens++;  // one chunk per token (stop-string holdback aside, none here)
    }
  }
  return { ttft: first - t0, e2e: performance.now() - t0, itl, tokens };
}

// warm-up, then the RSS baseline
await oneRequest("warm up");
const rssStart = rss();
const results = [], itls = [];
let failed = 0;
const tEnd = performance.now() + seconds * 1000;
const t0 = performance.now();
await Promise.all(Array.from({ length: clients }, async (_, c) => {
  let seed = 1234567 + c * 7919;
  while (performance.now() < tEnd) {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    const at = seed % Math.max(1, text.length - 400);
    const prompt = text.slice(at, at + 64 + (seed % 256));
    try {
      const r = await oneRequest(prompt);
      results.push(r);
      itls.push(...r.itl);
    } catch (e) {
      failed++;
    }
  }
}));
const wall = (performance.now() - t0) / 1000;
const rssEnd = rss();
proc.kill("SIGTERM");
const exit = await new Promise((res) => proc.on("exit", (c) => res(c)));

const pct = (xs, p) => {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const ms = (xs) => ({ mean: xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length), p50: pct(xs, 50), p90: pct(xs, 90), p99: pct(xs, 99) });
let commit = "unknown";
try { commit = execSync("git rev-parse --short=12 HEAD", { encoding: "utf8" }).trim(); } catch {}
const out = {
  bench: "serve_load", commit, date: new Date().toISOString(), machine: `${hostname()}, ${cpus().length} cpus, ${cpus()[0].model}`,
  model, device: (log.match(/ready: model '[^']*' \((\w+)\)/) || [, args.device || "auto"])[1], clients, seconds, max_tokens: maxTokens, max_seqs: maxSeqs,
  completed: results.length, failed, wall_s: wall,
  request_throughput: results.length / wall,
  output_token_throughput: results.reduce((a, r) => a + r.tokens, 0) / wall,
  ttft_ms: ms(results.map((r) => r.ttft)), itl_ms: ms(itls), e2e_ms: ms(results.map((r) => r.e2e)),
  rss_mib_start: rssStart, rss_mib_end: rssEnd, server_exit: exit,
};
console.log(JSON.stringify(out, null, 1));
if (args.json) writeFileSync(args.json, JSON.stringify(out, null, 1) + "\n");
const flat = rssEnd - rssStart < Math.max(16, 0.1 * rssStart);
console.error(`${out.completed} requests, ${failed} failed, ${out.request_throughput.toFixed(2)} req/s, ` +
  `${out.output_token_throughput.toFixed(1)} tok/s, TTFT p50 ${out.ttft_ms.p50?.toFixed(1)} ms, ITL p50 ${out.itl_ms.p50?.toFixed(2)} ms, ` +
  `RSS ${rssStart.toFixed(1)} -> ${rssEnd.toFixed(1)} MiB (${flat ? "flat" : "GREW"}), exit ${exit}`);
process.exit(failed === 0 && flat && exit === 0 ? 0 : 1);
