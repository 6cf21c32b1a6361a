// idgen from Node.js: unique 64-bit IDs from the embedded generator or the fleet, public IDs,
// and decode. Every rule (leases, the fence, the clock gate, prefetch, failover, the layouts) is
// idgen's Rust core, which this package wraps through Node-API; nothing of it is written again
// here. This file gives the native module its JavaScript shape: IDs as strings (or bigints, on
// request), never as a `number`, and the native errors as the classes below.

import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const native = require('./idgen.linux-x64-gnu.node');
/** This package's version (package.json's: its one place). */
export const version = require('./package.json').version;
const MARK = 'idgen:';

const constants = native.constants();
/** The most IDs one `nextIds` or `nextUuids` call returns. */
export const MAX_COUNT = constants.maxCount;
/** The prefix of the environment variables that override a generator's configuration file. */
export const DEFAULT_ENV_PREFIX = constants.defaultEnvPrefix;

/**
 * Every error the package raises. `IdgenInvalidInputError` is a `RangeError`, and an
 * `IdgenError` to `instanceof` too (a class has one parent: this one's `instanceof` also takes it).
 */
export class IdgenError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'IdgenError';
  }

  static [Symbol.hasInstance](value) {
    return Function.prototype[Symbol.hasInstance].call(this, value) || (this === IdgenError && value instanceof IdgenInvalidInputError);
  }
}

/** No ID now: `reason` is one word, `retryAfterMs` the wait where waiting helps (else null). */
export class IdgenRefusedError extends IdgenError {
  constructor(message, reason, retryAfterMs, options) {
    super(message, options);
    this.name = 'IdgenRefusedError';
    this.reason = reason;
    this.retryAfterMs = retryAfterMs ?? null;
  }
}

/** A service refused the request for a reason of its own: its 4xx `status` and `code`. */
export class IdgenRejectedError extends IdgenError {
  constructor(message, status, code, options) {
    super(message, options);
    this.name = 'IdgenRejectedError';
    this.status = status;
    this.code = code;
  }
}

/** Bad input (a RangeError): `code` names it as the shared test vectors do. */
export class IdgenInvalidInputError extends RangeError {
  constructor(message, code, options) {
    super(message, options);
    this.name = 'IdgenInvalidInputError';
    this.code = code;
  }
}

/** The native module's error as this package's class; anything else unchanged. */
function translate(error) {
  if (!(error instanceof Error) || !error.message.startsWith(MARK)) return error;
  const body = JSON.parse(error.message.slice(MARK.length));
  // The native error stays reachable as `cause` (its stack is where the call crossed over).
  const options = { cause: error };
  switch (body.kind) {
    case 'invalid':
      return new IdgenInvalidInputError(body.message, body.code, options);
    case 'refused':
      return new IdgenRefusedError(body.message, body.reason, body.retryAfterMs, options);
    case 'rejected':
      return new IdgenRejectedError(body.message, body.status, body.code, options);
    default:
      return new IdgenError(body.message, options);
  }
}

function sync(call) {
  try {
    return call();
  } catch (error) {
    throw translate(error);
  }
}

async function settle(promise) {
  try {
    return await promise;
  } catch (error) {
    throw translate(error);
  }
}

function kind(value) {
  return value === null ? 'null' : typeof value;
}

/** An ID as this package takes it: its decimal text (or a UUIDv7's) or a bigint; never a number. */
function readId(id) {
  if (typeof id === 'string' || typeof id === 'bigint') return id;
  if (typeof id === 'number') {
    throw new TypeError(
      `an ID is a string or a bigint, not a number: a JavaScript number is exact only to 2^53 - 1, ` +
        `and IDs go past it (${id} may already have lost its last digits); pass the ID's text or a bigint`,
    );
  }
  throw new TypeError(`an ID is a string or a bigint, not ${kind(id)}`);
}

function readCount(count) {
  if (typeof count !== 'number') throw new TypeError(`count is a number, not ${kind(count)}`);
  if (!Number.isSafeInteger(count) || count < 1 || count > MAX_COUNT) {
    throw new IdgenInvalidInputError(`count must be 1 to ${MAX_COUNT}, not ${count}`, 'invalid_count');
  }
  return count;
}

function optionalString(value, what) {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string') throw new TypeError(`${what} is a string, not ${kind(value)}`);
  return value;
}

/** `{ configFile }` alone, or the Rust client's keys as an options object. */
function readSettings(options, what) {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`${what}'s options are an object, not ${kind(options)}`);
  }
  const { configFile, ...settings } = options;
  if (configFile !== undefined) {
    if (Object.keys(settings).length > 0) {
      throw new IdgenInvalidInputError(`give ${what}'s settings or a configuration file, not both`, 'invalid_config');
    }
    return [null, optionalString(configFile, 'configFile')];
  }
  return [JSON.stringify(settings), null];
}

function decoded(fields) {
  const out = {
    id: fields.id,
    layout: fields.layout,
    createdAt: new Date(fields.createdAtUnixMs),
    createdAtUnixMs: fields.createdAtUnixMs,
  };
  for (const key of ['regionNumber', 'region', 'machine', 'sequence']) {
    if (fields[key] !== undefined && fields[key] !== null) out[key] = fields[key];
  }
  return Object.freeze(out);
}

function mapping(fields) {
  if (fields === null || fields === undefined) return null;
  const out = { publicId: fields.publicId, internalId: fields.internalId };
  for (const key of ['format', 'type', 'created']) {
    if (fields[key] !== undefined && fields[key] !== null) out[key] = fields[key];
  }
  return Object.freeze(out);
}

/** The calls both ID handles answer: the embedded generator and the fleet client. */
class IdSource {
  #native;
  #source;
  #take;

  /** `handle`: the native generator or client; `take`: one ID without waiting, or null. */
  constructor(handle, take) {
    this.#native = handle;
    this.#source = handle.source();
    this.#take = take;
  }

  /** One ID as its decimal text. A promise only in form when an ID is at hand (no wait). */
  nextId() {
    try {
      const id = this.#take();
      if (id !== null) return Promise.resolve(id);
    } catch (error) {
      return Promise.reject(translate(error));
    }
    return settle(this.#source.nextId());
  }

  /** One ID as a bigint. Like `nextId()`, no thread while an ID is at hand. */
  nextIdBigInt() {
    try {
      const id = this.#take();
      if (id !== null) return Promise.resolve(BigInt(id));
    } catch (error) {
      return Promise.reject(translate(error));
    }
    return settle(this.#source.nextIdBigint());
  }

  /** `count` increasing IDs, as text. (The native module joins a batch into one string.) */
  async nextIds(count) {
    return (await settle(this.#source.nextIds(readCount(count)))).split(',');
  }

  /** `count` increasing UUIDv7s, as lowercase hyphenated text. */
  async nextUuids(count) {
    return (await settle(this.#source.nextUuids(readCount(count)))).split(',');
  }

  /** `id` (text or bigint) taken apart by the schedule in force, regions named. */
  decode(id) {
    const input = readId(id);
    return decoded(sync(() => this.#source.decode(input)));
  }

  /** The handle's metrics in the Prometheus text format, to serve or append to prom-client's. */
  metricsText() {
    return sync(() => this.#native.metricsText());
  }
}

// Generators not closed when the event loop runs dry: closed then (`beforeExit`), so that their
// leases are released at once rather than left to expire. (A process ended by `process.exit()`
// or a signal leaves them to expire: Node runs nothing asynchronous then.)
const OPEN_REF = Symbol('idgen.openRef');
const open = new Set();
let watchingExit = false;

function closeBeforeExit(generator) {
  open.add(generator[OPEN_REF]);
  if (watchingExit) return;
  watchingExit = true;
  process.on('beforeExit', () => {
    const left = [...open].map((ref) => ref.deref()).filter(Boolean);
    open.clear();
    // Closing schedules work, so the loop runs once more, and this runs again with none left.
    for (const generator of left) generator.close().catch(() => {});
  });
}

/**
 * The embedded generator: the worker's generator in this process, on its own lease (SQLite or
 * DynamoDB, as the configuration file says). `nextIdSync()` and, in form, `nextId()` take no
 * lock and make no call while the current millisecond has IDs left.
 */
export class EmbeddedGenerator extends IdSource {
  #native;
  #take;

  /** @internal */
  constructor(handle) {
    // The take as a plain Node-API function bound to this generator: the hot path.
    const take = handle.bindTryNextId();
    super(handle, take);
    this.#native = handle;
    this.#take = take;
  }

  /**
   * Starts a generator from `configPath` and the environment variables under `envPrefix`, and
   * waits up to `readyTimeoutMs` (default 10,000; null: not at all) for its first lease.
   */
  static async start(configPath, options = {}) {
    const path = optionalString(configPath, 'configPath');
    const { envPrefix, readyTimeoutMs = 10_000, ...rest } = options ?? {};
    if (Object.keys(rest).length > 0) {
      throw new IdgenInvalidInputError(`unknown option ${Object.keys(rest)[0]}`, 'invalid_config');
    }
    if (readyTimeoutMs !== null && !(Number.isInteger(readyTimeoutMs) && readyTimeoutMs >= 0 && readyTimeoutMs <= 86_400_000)) {
      throw new IdgenInvalidInputError(`readyTimeoutMs is 0 to 86400000 or null, not ${readyTimeoutMs}`, 'invalid_config');
    }
    const handle = await settle(native.NativeEmbedded.start(path, optionalString(envPrefix, 'envPrefix'), readyTimeoutMs));
    const generator = new EmbeddedGenerator(handle);
    closeBeforeExit(generator);
    return generator;
  }

  /**
   * One ID as text, synchronously: at once while the current millisecond has IDs left; when it
   * has none, it blocks this thread until the next millisecond (under 1 ms), and a refusal throws.
   */
  nextIdSync() {
    try {
      const id = this.#take();
      return id !== null ? id : this.#native.nextIdSync();
    } catch (error) {
      throw translate(error);
    }
  }

  /** `null` while issuing, else the `IdgenRefusedError` a call would get now (not thrown). */
  refusal() {
    try {
      this.#native.health();
      return null;
    } catch (error) {
      return translate(error);
    }
  }

  get region() {
    return sync(() => this.#native.identity()).region;
  }

  get regionNumber() {
    return sync(() => this.#native.identity()).regionNumber;
  }

  /** The name in this generator's lease rows. */
  get holder() {
    return sync(() => this.#native.identity()).holder;
  }

  /** Stops issuing and releases the leases; later calls fail. */
  close() {
    open.delete(this.#ref);
    return settle(this.#native.close());
  }

  /** @internal */
  #ref = new WeakRef(this);

  /** @internal */
  get [OPEN_REF]() {
    return this.#ref;
  }

  [Symbol.asyncDispose]() {
    return this.close();
  }
}

/**
 * The fleet's client: prefetched IDs, failover to `backups` and back, local decode. Its options
 * are the Rust client's keys (`url`, `backups`, `prefetch: { batch, low_water, validity_ms }`,
 * `tls: { ca, cert, key }`, `registry_url`, …), or `{ configFile }`: a TOML file of them.
 */
export class Client extends IdSource {
  #native;

  /** @internal */
  constructor(handle) {
    super(handle, () => handle.tryNextId());
    this.#native = handle;
  }

  static async connect(options) {
    const [json, file] = readSettings(options, 'the client');
    return new Client(await settle(native.NativeClient.connect(json, file)));
  }

  /** The endpoint requests go to now (the local fleet, or a backup after a failover). */
  get endpoint() {
    return sync(() => this.#native.endpoint());
  }

  /** Drops the connections and the buffer; later calls fail. */
  close() {
    this.#native.close();
  }

  [Symbol.dispose]() {
    this.close();
  }
}

/**
 * The public-ID service's client. Options as the fleet client's that apply to one endpoint:
 * `url`, `request_timeout_ms`, `connect_timeout_ms`, `tls`, or `{ configFile }`.
 */
export class PublicIds {
  #native;

  constructor(options) {
    const [json, file] = readSettings(options, 'the public-ID client');
    this.#native = sync(() => new native.NativePublicIds(json, file));
  }

  /** The mapping of `internalId`, made now or found (`created` says which). */
  async create(internalId, { format, type } = {}) {
    const id = readId(internalId);
    const made = await settle(this.#native.create(id, optionalString(format, 'format'), optionalString(type, 'type')));
    return mapping(made);
  }

  /** Lets go of its connections; later calls fail. */
  close() {
    this.#native.close();
  }

  [Symbol.dispose]() {
    this.close();
  }

  /** The mapping of a public ID, or null (unknown and forged look the same). */
  async resolve(publicId) {
    if (typeof publicId !== 'string') throw new TypeError(`a public ID is a string, not ${kind(publicId)}`);
    return mapping(await settle(this.#native.resolve(publicId)));
  }

  /** The public ID of `internalId` in a format (or of a type), or null. */
  async lookup(internalId, { format, type } = {}) {
    const id = readId(internalId);
    return mapping(await settle(this.#native.lookup(id, optionalString(format, 'format'), optionalString(type, 'type'))));
  }
}

/**
 * `id` taken apart under the built-in schedule (development; a generator's or a client's
 * `decode` uses the registry's), naming regions from `regions` (number → name).
 */
export function decode(id, regions) {
  const input = readId(id);
  let names = null;
  if (regions !== undefined && regions !== null) {
    if (typeof regions !== 'object') throw new TypeError(`regions is an object, not ${kind(regions)}`);
    names = Object.fromEntries(Object.entries(regions instanceof Map ? Object.fromEntries(regions) : regions).map(([k, v]) => [String(k), String(v)]));
  }
  return decoded(sync(() => native.decode(input, names)));
}

/** The built-in schedule: one entry per layout. */
export function defaultSchedule() {
  return native.defaultSchedule();
}

/** A TypeID's prefix (empty for none) and its UUID. */
export function parseTypeid(text) {
  if (typeof text !== 'string') throw new TypeError(`a TypeID is a string, not ${kind(text)}`);
  return sync(() => native.parseTypeid(text));
}

/** The TypeID of `prefix` (empty for none) and a UUID's text. */
export function typeidText(prefix, uuid) {
  if (typeof prefix !== 'string' || typeof uuid !== 'string') throw new TypeError('the prefix and the UUID are strings');
  return sync(() => native.typeidText(prefix, uuid));
}
