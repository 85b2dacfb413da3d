// Load check with the unmodified official OpenAI Node SDK, driven by
// ../../node_test.go (TestNodeOpenAISDKAllSucceed).
//
// Sends N chat completions (env N, default 400) with at most C in flight
// (env C, default 50), then one streaming chat completion whose chunks are
// timestamped as they arrive. The client keeps the SDK's default retries.
// Prints one JSON line:
//   {ok, failed, firstErrors, makespanMs, streamChunks, streamChunkTimesMs}
// (plus streamError if the streaming request failed)
// and exits 0 even when requests failed: the Go test judges the numbers.
//
// Env: OPENAI_BASE_URL (required, e.g. http://127.0.0.1:8080/v1),
// OPENAI_API_KEY (default a fake test key), N, C, MODEL.
import OpenAI from 'openai';

const baseURL = process.env.OPENAI_BASE_URL;
if (!baseURL) {
  console.error('openai_load: OPENAI_BASE_URL is not set');
  process.exit(2);
}
const n = positiveInt(process.env.N, 400);
const c = positiveInt(process.env.C, 50);
const model = process.env.MODEL || 'gpt-e2e-node';

// No maxRetries: the SDK's default retry behaviour is part of what is tested.
const client = new OpenAI({
  baseURL,
  apiKey: process.env.OPENAI_API_KEY || 'sk-e2e-node-fake-key',
});

function positiveInt(v, dflt) {
  const x = Number.parseInt(v ?? '', 10);
  return Number.isFinite(x) && x > 0 ? x : dflt;
}

function describe(err) {
  const status = err?.status ? `${err.status} ` : '';
  return `${status}${err?.name ?? 'Error'}: ${err?.message ?? String(err)}`;
}

async function load() {
  let ok = 0;
  let failed = 0;
  const firstErrors = [];
  let next = 0;
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= n) return;
      try {
        const resp = await client.chat.completions.create({
          model,
          messages: [{ role: 'user', content: `question ${i}` }],
        });
        if (resp.choices?.length !== 1 || typeof resp.choices[0].message?.content !== 'string') {
          throw new Error(`request ${i}: answer without one text choice`);
        }
        ok++;
      } catch (err) {
        failed++;
        if (firstErrors.length < 5) firstErrors.push(`request ${i}: ${describe(err)}`);
      }
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: Math.min(c, n) }, worker));
  return { ok, failed, firstErrors, makespanMs: Math.round(performance.now() - start) };
}

// streamCheck sends one streaming request and records, for each chunk that
// carries content, the milliseconds since the request was sent.
async function streamCheck() {
  const times = [];
  const start = performance.now();
  try {
    const stream = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'stream please' }],
      stream: true,
    });
    for await (const chunk of stream) {
      if (chunk.choices?.[0]?.delta?.content) {
        times.push(Math.round((performance.now() - start) * 10) / 10);
      }
    }
    return { streamChunks: times.length, streamChunkTimesMs: times };
  } catch (err) {
    return { streamChunks: times.length, streamChunkTimesMs: times, streamError: describe(err) };
  }
}

const result = await load();
Object.assign(result, await streamCheck());
console.log(JSON.stringify(result));
