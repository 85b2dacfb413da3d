// Preloaded with `node --import ./loopback_only.mjs` by ../../node_test.go so
// that the Node clients under test can reach loopback addresses and nothing
// else: no DNS lookups of other names and no TCP connections to other hosts.
//
// promptfoo posts a "telemetry disabled" event to r.promptfoo.app even with
// PROMPTFOO_DISABLE_TELEMETRY=1; this guard refuses that connection (and any
// other) before a name is resolved. Each refused host is reported once on
// stderr, prefixed "loopback_only:".
import dns from 'node:dns';
import net from 'node:net';
import { syncBuiltinESMExports } from 'node:module';

const reported = new Set();

function isLoopbackHost(host) {
  if (host === undefined || host === null || host === '') return true; // Node's default is localhost
  const h = String(host).replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  if (net.isIPv4(h)) return h.startsWith('127.');
  if (net.isIPv6(h)) return h === '::1' || h.startsWith('::ffff:127.');
  return false;
}

function refusal(host, port) {
  const where = port === undefined ? String(host) : `${host}:${port}`;
  if (!reported.has(where)) {
    reported.add(where);
    process.stderr.write(`loopback_only: refused ${where}\n`);
  }
  const err = new Error(`loopback_only: ${where} is not a loopback address`);
  err.code = 'ECONNREFUSED';
  return err;
}

// Every TCP and TLS client connection goes through Socket.prototype.connect.
const connect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function (...args) {
  let opts = args[0];
  if (Array.isArray(opts)) opts = opts[0]; // net.connect passes normalized args
  if (opts === null || typeof opts !== 'object') opts = { port: args[0], host: args[1] };
  if (opts.path === undefined && !isLoopbackHost(opts.host)) {
    const err = refusal(opts.host, opts.port);
    process.nextTick(() => this.destroy(err));
    return this;
  }
  return connect.apply(this, args);
};

// Lookups of other names fail without asking a resolver.
const lookup = dns.lookup;
dns.lookup = function (hostname, options, callback) {
  const cb = typeof options === 'function' ? options : callback;
  if (!isLoopbackHost(hostname)) {
    const err = refusal(hostname);
    process.nextTick(() => cb(err));
    return {};
  }
  return lookup.call(this, hostname, options, callback);
};
const lookupPromise = dns.promises.lookup;
dns.promises.lookup = async function (hostname, options) {
  if (!isLoopbackHost(hostname)) throw refusal(hostname);
  return lookupPromise.call(this, hostname, options);
};
syncBuiltinESMExports();
