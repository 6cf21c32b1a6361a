// Types of the `idgen-sdk` package (index.js). IDs are strings (decimal text) or bigints, never a
// JavaScript `number`: a number is exact only to 2^53 - 1, and IDs go past it.

/** This package's version (package.json's: its one place). */
export declare const version: string;
/** The most IDs one `nextIds` or `nextUuids` call returns. */
export declare const MAX_COUNT: number;
/** The prefix of the environment variables that override a generator's configuration file. */
export declare const DEFAULT_ENV_PREFIX: string;

/** Every error the package raises: `IdgenRefusedError`, `IdgenRejectedError`,
 * `IdgenInvalidInputError` (a `RangeError`, and an `IdgenError` to `instanceof`), and itself for
 * the rest (a configuration that cannot start, a closed handle, an unreadable answer from the
 * fleet). The native error it came from, if any, is its `cause`. A value of the wrong type (a
 * `number` where an ID goes) is a `TypeError`. */
export declare class IdgenError extends Error {}

/** Why no ID now: the generator's (`lease`, `clock_behind`, `clock_unsynchronized`,
 * `schedule`), a handle made before this process forked (`forked`), or the fleet's
 * (`over_quota`, `unavailable`: no endpoint answered). */
export type RefusalReason =
  | 'lease'
  | 'clock_behind'
  | 'clock_unsynchronized'
  | 'schedule'
  | 'forked'
  | 'over_quota'
  | 'unavailable';

/** No ID now: `reason` says why; `retryAfterMs` where waiting helps, else null. */
export declare class IdgenRefusedError extends IdgenError {
  readonly reason: RefusalReason;
  readonly retryAfterMs: number | null;
}

/** A service refused the request for a reason of its own: `status` (a 4xx) and `code`
 * (`unknown_type`, `format_not_allowed`, …), as its API documents them. */
export declare class IdgenRejectedError extends IdgenError {
  readonly status: number;
  readonly code: string;
}

/** Bad input. `code` names it as the shared test vectors do (`out_of_range`, `not_an_id`,
 * `malformed_uuid`, `not_uuidv7`, `invalid_count`, `invalid_config`, …). */
export declare class IdgenInvalidInputError extends RangeError {
  readonly code: string;
}

/** An ID taken apart. For a UUIDv7 (`layout === "uuidv7"`) only `id` and the time are set;
 * `regionNumber` only for layouts with a region field, `region` where it has a name. */
export interface Decoded {
  /** The decimal text of a 63-bit ID, or the UUID's lowercase hyphenated text. */
  readonly id: string;
  readonly layout: string;
  readonly createdAt: Date;
  readonly createdAtUnixMs: number;
  readonly regionNumber?: number;
  readonly region?: string;
  readonly machine?: number;
  readonly sequence?: number;
}

/** An ID as the package takes it: its text (decimal, or a UUIDv7) or a bigint. */
export type IdInput = string | bigint;

/** The calls both ID handles answer: the embedded generator and the fleet client. */
declare abstract class IdSource {
  /** One ID as its decimal text. Settles at once while one is at hand (no wait, no thread). */
  nextId(): Promise<string>;
  /** One ID as a bigint. */
  nextIdBigInt(): Promise<bigint>;
  /** `count` (1 to MAX_COUNT) increasing IDs, as decimal text. */
  nextIds(count: number): Promise<string[]>;
  /** `count` (1 to MAX_COUNT) increasing UUIDv7s, as lowercase hyphenated text. */
  nextUuids(count: number): Promise<string[]>;
  /** `id` taken apart by the schedule in force (the registry's), regions named. */
  decode(id: IdInput): Decoded;
  /** The handle's metrics in the Prometheus text format (to serve, or to append to prom-client's). */
  metricsText(): string;
}

export interface StartOptions {
  /** The prefix of the environment variables that override the file's keys (default `IDGEN_EMBEDDED`). */
  envPrefix?: string;
  /** How long to wait for the first lease (default 10,000); null: settle at once, refusing until then. */
  readyTimeoutMs?: number | null;
}

/** The embedded generator: the worker's generator in this process, on its own lease (SQLite or
 * DynamoDB, as its configuration file says). */
export declare class EmbeddedGenerator extends IdSource {
  private constructor();
  static start(configPath?: string | null, options?: StartOptions): Promise<EmbeddedGenerator>;
  /** One ID, synchronously: at once while the current millisecond has IDs left, else this
   * thread waits as the generator does (the next millisecond); a refusal throws. */
  nextIdSync(): string;
  /** null while issuing, else the refusal a call would get now (not thrown). */
  refusal(): IdgenRefusedError | null;
  readonly region: string;
  readonly regionNumber: number;
  /** The name in this generator's lease rows. */
  readonly holder: string;
  /** Stops issuing and releases the leases; later calls fail. */
  close(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** TLS settings of a client (mutual TLS): PEM file paths. */
export interface TlsOptions {
  ca?: string;
  cert?: string;
  key?: string;
  [key: string]: unknown;
}

/** The Rust client's configuration keys (`idgen-client`'s `ClientConfig`); unknown keys are refused. */
export interface ClientOptions {
  url: string;
  backups?: string[];
  registry_url?: string;
  request_timeout_ms?: number;
  connect_timeout_ms?: number;
  probe_interval_ms?: number;
  prefetch?: { batch?: number; low_water?: number; validity_ms?: number };
  tls?: TlsOptions;
  [key: string]: unknown;
}

/** A TOML file of the same keys, instead of the options object. */
export interface ConfigFile {
  configFile: string;
}

/** The fleet's client: prefetched IDs, failover to `backups` and back, local decode. */
export declare class Client extends IdSource {
  private constructor();
  static connect(options: ClientOptions | ConfigFile): Promise<Client>;
  /** The endpoint requests go to now (the local fleet, or a backup after a failover). */
  readonly endpoint: string;
  close(): void;
  [Symbol.dispose](): void;
}

/** A public ID and the internal ID it stands for. `format` from `create` and `lookup`; `created`
 * from `create` only (whether that call made the mapping). */
export interface Mapping {
  readonly publicId: string;
  readonly internalId: string;
  readonly format?: string;
  readonly type?: string;
  readonly created?: boolean;
}

export interface PublicIdsOptions {
  url: string;
  request_timeout_ms?: number;
  connect_timeout_ms?: number;
  tls?: TlsOptions;
}

/** The form (`opaque`, `uuidv7`, `encrypted`, …) or the type (a TypeID prefix) of a public ID. */
export interface PublicIdKind {
  format?: string;
  type?: string;
}

/** The public-ID service's client. */
export declare class PublicIds {
  constructor(options: PublicIdsOptions | ConfigFile);
  create(internalId: IdInput, kind?: PublicIdKind): Promise<Mapping>;
  /** null for an unknown public ID (a forged one looks the same). */
  resolve(publicId: string): Promise<Mapping | null>;
  lookup(internalId: IdInput, kind?: PublicIdKind): Promise<Mapping | null>;
  /** Lets go of its connections; later calls fail. `using` closes it at the end of the block. */
  close(): void;
  [Symbol.dispose](): void;
}

/** `id` taken apart under the built-in schedule, naming regions from `regions` (number → name). */
export declare function decode(id: IdInput, regions?: Record<number, string> | Map<number, string>): Decoded;

export interface LayoutFrom {
  layout: string;
  regionBits: number;
  machineBits: number;
  sequenceBits: number;
  fromUnixMs: number;
}

/** The built-in schedule (v1 from the epoch, v2 from 2028-01-01). */
export declare function defaultSchedule(): LayoutFrom[];

/** A TypeID's prefix (empty for none) and its UUID's text. */
export declare function parseTypeid(text: string): { prefix: string; uuid: string };

/** The TypeID of `prefix` (empty for none) and a UUID's text. */
export declare function typeidText(prefix: string, uuid: string): string;
