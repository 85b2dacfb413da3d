// An eval run through the unmodified official OpenAI Node SDK, driven by
// ../../journal_test.go: N chat completions with at most C in flight,
// every fifth one streamed, all in one run (x-llmproxy-run: RUN). Each
// answer's raw bytes (a stream's whole event sequence) are hashed with
// SHA-256, and one JSON line is printed as each answer completes:
//   {"i":7,"stream":false,"sha":"…","journal":"hit","joined":false}
// (or {"i":7,"error":"…"}), then a last line {"done":N,"failed":F,"ms":T}.
// The Go test may kill the process at any time.
//
// Env: OPENAI_BASE_URL (required), OPENAI_API_KEY, N (default 2000), C
// (default 50), RUN (default "eval"), SAME=1 (every request the same
// prompt at temperature 1, none streamed), TIMEOUT_MS (the SDK's
// timeout; default its own), JOURNAL (x-llmproxy-journal), MODEL.
import { createHash } from 'node:crypto';
import OpenAI from 'openai';

const baseURL = process.env.OPENAI_BASE_URL;
if (!baseURL) {
  console.error('journal_run: OPENAI_BASE_URL is not set');
  process.exit(2);
}
const n = positiveInt(process.env.N, 2000);
const c = positiveInt(process.env.C, 50);
const run = process.env.RUN || 'eval';
const same = process.env.SAME === '1';
const model = process.env.MODEL || 'gpt-e2e-journal';
const options = {
  baseURL,
  apiKey: process.env.OPENAI_API_KEY || 'sk-e2e-journal-fake-key',
  defaultHeaders: { 'x-llmproxy-run': run },
};
if (process.env.JOURNAL) options.defaultHeaders['x-llmproxy-journal'] = process.env.JOURNAL;
// A timeout given with each request is one the SDK states to the server
// (X-Stainless-Timeout); a client-level one it does not.
const perRequest = process.env.TIMEOUT_MS ? { timeout: positiveInt(process.env.TIMEOUT_MS, 600000) } : undefined;
const client = new OpenAI(options);

function positiveInt(v, dflt) {
  const x = Number.parseInt(v ?? '', 10);
  return Number.isFinite(x) && x > 0 ? x : dflt;
}

async function one(i) {
  const stream = !same && i % 5 === 0;
  const params = same
    ? { model, temperature: 1, messages: [{ role: 'user', content: 'the same question' }] }
    : { model, messages: [{ role: 'user', content: `question ${i}` }], stream };
  // asResponse: the raw answer, after the SDK's own retries.
  const res = await client.chat.completions.create(params, perRequest).asResponse();
  const body = Buffer.from(await res.arrayBuffer());
  if (res.status !== 200) throw new Error(`status ${res.status}: ${body.toString().slice(0, 200)}`);
  return {
    i,
    stream,
    sha: createHash('sha256').update(body).digest('hex'),
    journal: res.headers.get('x-llmproxy-journal') ?? '',
    joined: res.headers.get('x-llmproxy-joined') === 'true',
  };
}

let next = 0;
let failed = 0;
const start = performance.now();
const worker = async () => {
  for (;;) {
    const i = next++;
    if (i >= n) return;
    try {
      console.log(JSON.stringify(await one(i)));
    } catch (err) {
      failed++;
      console.log(JSON.stringify({ i, error: `${err?.status ?? ''} ${err?.name ?? 'Error'}: ${err?.message ?? String(err)}` }));
    }
  }
};
await Promise.all(Array.from({ length: Math.min(c, n) }, worker));
console.log(JSON.stringify({ done: n, failed, ms: Math.round(performance.now() - start) }));
