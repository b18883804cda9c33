// openai_sdk_test.mjs — the official OpenAI Node SDK (npm package `openai`, pinned in package.json)
// against `cvllm serve`: model list, chat without and with streaming, tools (a tool-call
// conversation, tool_choice errors as SDK exceptions, streamed tool-call deltas), the reasoning
// fields, and a wrong API key.
//
// Usage: node openai_sdk_test.mjs CVLLM_BINARY SOURCE_DIR   (ctest runs it as test_openai_sdk)
//
// The server runs the Qwen3 shape with the full vocabulary and random weights (--load-format dummy,
// the reference checkpoint's config), so it starts in a second and its replies are deterministic
// under temperature 0 but meaningless. What is checked is therefore what the SDK sees: that every
// reply and stream parses into the SDK's types, streaming adds up to the non-streaming reply, errors
// arrive as the SDK's exception classes, and reasoning lands in `reasoning` when the prompt leaves a
// <think> block open (the model's own output then starts inside it).
//
// Transport: the SDK is given the platform's fetch (Node >= 18) instead of its bundled node-fetch@2.
// node-fetch@2 decides that a chunked response ended badly when its keep-alive socket still has a
// 'data' listener at the response's 'close' event; Node's 2026 security releases (Debian 12's Node
// 18.20.4+dfsg-1~deb12u3 among them; nodejs/node#63989) leave that listener in place after a complete
// response, so every stream fails with "Premature close" there, against any server (a Python
// http.server that writes correct chunked framing fails the same way). testStreamFraming checks the
// server's side of it on the wire instead: each stream ends with the last chunk, and the connection
// stays usable for the next request, also after a client abandons a stream half way.
//
// Exit status: 0 passed, 1 failed, 77 skipped (the npm package is not installed: `npm ci` in
// tests/sdk, which tools/test.sh does). Everything is bounded by one overall timer.
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

const OVERALL_TIMEOUT_MS = 150_000;
const MODEL = "qwen3-sdk";
const API_KEY = "sk-sdk-test";

const [binary, sourceDir] = process.argv.slice(2);
if (!binary || !sourceDir) {
  console.error("usage: node openai_sdk_test.mjs CVLLM_BINARY SOURCE_DIR");
  process.exit(2);
}

let OpenAI;
try {
  ({ default: OpenAI } = await import("openai"));
} catch {
  console.log("skipped: the openai package is not installed (run `npm ci` in tests/sdk)");
  process.exit(77);
}

let failures = 0;
let passes = 0;
function check(cond, what) {
  if (cond) {
    passes++;
  } else {
    failures++;
    console.error(`FAIL: ${what}`);
  }
}

// A model folder with the reference checkpoint's config at the full Qwen3 vocabulary, and the
// tokenizer (with its chat template) that cvllm ships. Dummy weights need nothing else.
function makeModelDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cvllm-sdk-"));
  const ref = path.join(sourceDir, "tests/data/vectors/qwen3-dense-f32");
  const config = JSON.parse(fs.readFileSync(path.join(ref, "config.json"), "utf8"));
  config.vocab_size = 151936;
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(config));
  fs.symlinkSync(path.join(ref, "generation_config.json"), path.join(dir, "generation_config.json"));
  for (const f of ["tokenizer.json", "tokenizer_config.json"])
    fs.symlinkSync(path.join(sourceDir, "models/qwen3-tokenizer", f), path.join(dir, f));
  return dir;
}

// Starts the server on a free port; resolves with the port from its startup log line.
function startServer(dir) {
  const args = ["serve", dir, "--load-format", "dummy", "--served-model-name", MODEL, "--host", "127.0.0.1",
                "--port", "0", "--max-model-len", "2048", "--kv-cache-memory-bytes", "64M", "--num-threads", "2",
                "--seed", "1024", "--api-key", API_KEY, "--disable-log-stats", "--reasoning-parser", "qwen3",
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes"];
  const proc = spawn(binary, args, { stdio: ["ignore", "pipe", "pipe"] });
  let log = "";
  const ready = new Promise((resolve, reject) => {
    const onData = (data) => {
      log += data.toString();
      const m = log.match(/API server on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => reject(new Error(`cvllm serve exited with ${code} before it was ready:\n${log}`)));
  });
  return { proc, ready, log: () => log };
}

const WEATHER_TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const QUESTION = [
  { role: "system", content: "You are a helpful assistant." },
  { role: "user", content: "What is the weather in Paris?" },
];
const FINISH = new Set(["stop", "length", "tool_calls"]);

async function testModels(client) {
  const list = await client.models.list();
  check(list.data.length === 1 && list.data[0].id === MODEL, `models.list: ${JSON.stringify(list.data)}`);
}

// Non-streaming and streaming chat agree (greedy decoding on a deterministic model).
async function testChat(client) {
  const params = { model: MODEL, messages: QUESTION, max_tokens: 12, temperature: 0 };
  const reply = await client.chat.completions.create(params);
  const choice = reply.choices[0];
  check(reply.object === "chat.completion" && reply.id.startsWith("chatcmpl-"), `chat reply header: ${reply.id}`);
  check(choice.message.role === "assistant" && typeof choice.message.content === "string", "chat message");
  check(FINISH.has(choice.finish_reason), `chat finish_reason ${choice.finish_reason}`);
  check(reply.usage.completion_tokens > 0 && reply.usage.completion_tokens <= 12, "chat usage");

  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let finish = null;
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    check(chunk.object === "chat.completion.chunk" && chunk.id.startsWith("chatcmpl-"), "chunk header");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      role ??= c.delta.role ?? null;
      text += c.delta.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(role === "assistant", "stream: first delta carries the role");
  check(text === choice.message.content, `stream text ${JSON.stringify(text)} vs ${JSON.stringify(choice.message.content)}`);
  check(finish === choice.finish_reason, `stream finish_reason ${finish}`);
  check(usage && usage.completion_tokens === reply.usage.completion_tokens, "stream usage chunk");
}

async function testTools(client) {
  // With tools offered: a well-formed reply whose tool_calls (if any) have ids and JSON arguments.
  const params = { model: MODEL, messages: QUESTION, tools: [WEATHER_TOOL], tool_choice: "auto", max_tokens: 12,
                   temperature: 0 };
  const reply = await client.chat.completions.create(params);
  const msg = reply.choices[0].message;
  check(Array.isArray(msg.tool_calls ?? []), "tools: tool_calls is a list");
  for (const call of msg.tool_calls ?? []) {
    check(call.id.startsWith("chatcmpl-tool-") && call.type === "function", `tool call ${JSON.stringify(call)}`);
    JSON.parse(call.function.arguments);
  }
  check(FINISH.has(reply.choices[0].finish_reason), "tools: finish_reason");
  if (msg.tool_calls?.length) check(reply.choices[0].finish_reason === "tool_calls", "tools: finish_reason tool_calls");

  // Streamed: content and tool-call deltas add up to the same message.
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let text = "";
  const calls = [];
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      for (const d of c.delta.tool_calls ?? []) {
        calls[d.index] ??= { id: d.id, name: "", arguments: "" };
        calls[d.index].name += d.function?.name ?? "";
        calls[d.index].arguments += d.function?.arguments ?? "";
      }
    }
  check(text === (msg.content ?? ""), `tools stream text ${JSON.stringify(text)}`);
  check(calls.length === (msg.tool_calls?.length ?? 0), "tools stream: as many calls");

  // The conversation after a tool call: the assistant's call and the tool's result are rendered by
  // the model's template (SDK message types), and the model answers.
  const followUp = await client.chat.completions.create({
    model: MODEL, max_tokens: 4, temperature: 0, tools: [WEATHER_TOOL],
    messages: [
      ...QUESTION,
      { role: "assistant", content: null,
        tool_calls: [{ id: "call_1", type: "function",
                       function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } }] },
      { role: "tool", tool_call_id: "call_1", content: JSON.stringify({ temperature_c: 21, sky: "clear" }) },
    ],
  });
  check(followUp.choices.length === 1 && FINISH.has(followUp.choices[0].finish_reason), "tool result turn");

  // vLLM's validation errors arrive as the SDK's BadRequestError.
  const named = { type: "function", function: { name: "get_time" } };
  try {
    await client.chat.completions.create({ ...params, tool_choice: named });
    check(false, "an unknown named tool must be refused");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 &&
          /does not match any of the specified `tools`/.test(e.message), `named tool error: ${e}`);
  }
  try {
    await client.chat.completions.create({ ...params, tools: [] });
    check(false, "an empty tools list must be refused");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && /must not be an empty array/.test(e.message), `empty tools: ${e}`);
  }
}

// The assistant turn is continued inside an open <think>, so the output starts in reasoning:
// message.reasoning (and delta.reasoning) carry it, content stays null.
async function testReasoning(client) {
  const params = {
    model: MODEL, max_tokens: 8, temperature: 0, add_generation_prompt: false, continue_final_message: true,
    messages: [{ role: "user", content: "Why is the sky blue?" }, { role: "assistant", content: "<think>\nLet me" }],
  };
  const reply = await client.chat.completions.create(params);
  const msg = reply.choices[0].message;
  check(typeof msg.reasoning === "string" && msg.reasoning.length > 0, `reasoning: ${JSON.stringify(msg)}`);
  check(msg.content === null, "reasoning: content is null");
  const stream = await client.chat.completions.create({ ...params, stream: true });
  let reasoning = "";
  for await (const chunk of stream) for (const c of chunk.choices) reasoning += c.delta.reasoning ?? "";
  check(reasoning === msg.reasoning, `streamed reasoning ${JSON.stringify(reasoning)}`);
  const hidden = await client.chat.completions.create({ ...params, include_reasoning: false });
  check(hidden.choices[0].message.reasoning === null, "include_reasoning=false hides it");
}

async function testWrongKey(baseURL) {
  const client = new OpenAI({ baseURL, apiKey: "sk-wrong", maxRetries: 0, timeout: 30_000, fetch: globalThis.fetch });
  try {
    await client.models.list();
    check(false, "a wrong key must be refused");
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, `wrong key: ${e}`);
  }
}

// One keep-alive connection, raw HTTP/1.1: reads one response and decodes its chunked body.
function rawConnection(port) {
  const sock = net.connect(port, "127.0.0.1");
  let buf = Buffer.alloc(0);
  let waiter = null;
  let closed = false;
  const wake = (how, arg) => {
    const w = waiter;
    waiter = null;
    if (w) w[how](arg);
  };
  sock.on("data", (d) => {
    buf = Buffer.concat([buf, d]);
    wake("resolve");
  });
  sock.on("close", () => {
    closed = true;
    wake("reject", new Error("connection closed by the server"));
  });
  const more = () => new Promise((resolve, reject) => {
    if (closed) reject(new Error("connection closed by the server"));
    else waiter = { resolve, reject };
  });
  async function response() {
    let head;
    while ((head = buf.indexOf("\r\n\r\n")) < 0) await more();
    const headers = buf.subarray(0, head).toString();
    buf = buf.subarray(head + 4);
    const body = [];
    for (;;) {
      let eol;
      while ((eol = buf.indexOf("\r\n")) < 0) await more();
      const size = parseInt(buf.subarray(0, eol).toString(), 16);
      while (buf.length < eol + 2 + size + 2) await more();
      if (buf.subarray(eol + 2 + size, eol + 4 + size).toString() !== "\r\n") throw new Error("bad chunk framing");
      body.push(buf.subarray(eol + 2, eol + 2 + size));
      buf = buf.subarray(eol + 4 + size);
      if (size === 0) return { headers, body: Buffer.concat(body).toString(), rest: buf.length };
    }
  }
  function send(body) {
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${API_KEY}\r\n` +
               `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  }
  return { sock, response, send, pending: () => buf.length };
}

async function testStreamFraming(port) {
  const body = (maxTokens) => JSON.stringify({ model: MODEL, max_tokens: maxTokens, temperature: 0, stream: true,
                                               messages: QUESTION });
  const c = rawConnection(port);
  for (let i = 0; i < 2; i++) { // the second stream reuses the connection the first one ended on
    c.send(body(6));
    const r = await c.response();
    check(/^HTTP\/1\.1 200/.test(r.headers) && /transfer-encoding: chunked/i.test(r.headers), `stream ${i} headers`);
    check(r.body.endsWith("data: [DONE]\n\n") && r.rest === 0, `stream ${i} ends with [DONE] and the last chunk`);
  }
  c.sock.destroy();
  // A client that abandons a stream half way: the server notices, and serves the next connection.
  const a = rawConnection(port);
  a.send(body(400));
  while (a.pending() === 0) await new Promise((r) => setTimeout(r, 5));
  a.sock.destroy();
  const b = rawConnection(port);
  b.send(body(4));
  const r = await b.response();
  check(r.body.endsWith("data: [DONE]\n\n"), "a stream after an abandoned one ends cleanly");
  b.sock.destroy();
}

async function main() {
  const dir = makeModelDir();
  const server = startServer(dir);
  const timer = setTimeout(() => {
    console.error(`FAIL: timed out after ${OVERALL_TIMEOUT_MS / 1000} s\n${server.log()}`);
    server.proc.kill("SIGKILL");
    process.exit(1);
  }, OVERALL_TIMEOUT_MS);
  let exitCode = 1;
  try {
    const port = await server.ready;
    const baseURL = `http://127.0.0.1:${port}/v1`;
    const client = new OpenAI({ baseURL, apiKey: API_KEY, maxRetries: 0, timeout: 60_000, fetch: globalThis.fetch });
    await testModels(client);
    await testChat(client);
    await testTools(client);
    await testReasoning(client);
    await testWrongKey(baseURL);
    await testStreamFraming(port);
    server.proc.removeAllListeners("exit");
    const exited = new Promise((resolve) => server.proc.on("exit", resolve));
    server.proc.kill("SIGTERM");
    check((await exited) === 0, "cvllm serve exits 0 on SIGTERM");
    exitCode = failures ? 1 : 0;
  } catch (e) {
    console.error(`FAIL: ${e.stack ?? e}`);
    server.proc.kill("SIGKILL");
  } finally {
    clearTimeout(timer);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  console.log(`openai_sdk_test: ${passes} passed, ${failures} failed`);
  process.exit(exitCode);
}

await main();
