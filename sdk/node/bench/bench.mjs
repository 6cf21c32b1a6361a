// The Node package against its floor and its peers, in one run, as ratios (scripts/bench,
// stage 9): `node bench.mjs CONFIG SECONDS ROUNDS [WORKER_URL]`, run from a project where the
// package and the peers (sdk/node/tools) are installed.
//
// Per call, in nanoseconds, each measured ROUNDS times with the order rotated each round:
// process.hrtime.bigint() (the floor: one call into C++), the embedded generator's nextIdSync()
// and `await nextId()` (in bursts below the layout's cap, and flat out, where the cap of 4,096
// IDs a millisecond is what is measured), crypto.randomUUID(), uuid's v7(), ulid's ulid(),
// @sapphire/snowflake's generate(), and nextIds(1000) per ID. With WORKER_URL (a development
// `idgen worker`): the client's prefetched `await nextId()` against one fetch() per ID.

import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';

import { Snowflake } from '@sapphire/snowflake';
import { ulid } from 'ulid';
import { v7 as uuidv7 } from 'uuid';

import { Client, EmbeddedGenerator } from 'idgen-sdk';

const [config, secondsText, roundsText, worker] = process.argv.slice(2);
const seconds = Number(secondsText);
const rounds = Number(roundsText);
const now = () => process.hrtime.bigint();
let sink;

/** Per call, calls in blocks of 1,000 between clock reads. */
function perCall(call, per = 1) {
  let calls = 0;
  const started = now();
  const deadline = started + BigInt(Math.round(seconds * 1e9));
  for (;;) {
    for (let i = 0; i < 1000; i++) sink = call();
    calls += 1000;
    const t = now();
    if (t >= deadline) return Number(t - started) / (calls * per);
  }
}

async function perCallAsync(call, scale = 1, per = 1) {
  let calls = 0;
  const started = now();
  const deadline = started + BigInt(Math.round(seconds * scale * 1e9));
  for (;;) {
    for (let i = 0; i < 100; i++) sink = await call();
    calls += 100;
    const t = now();
    if (t >= deadline) return Number(t - started) / (calls * per);
  }
}

/**
 * Per call, in bursts below the layout's cap (v1: 4,096 IDs a millisecond for one machine
 * number), a millisecond's pause between bursts, only the bursts timed.
 */
async function paced(call, { per = 1, burst = 1000, awaited = false } = {}) {
  let spent = 0n;
  let calls = 0;
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    const started = now();
    if (awaited) for (let i = 0; i < burst; i++) sink = await call();
    else for (let i = 0; i < burst; i++) sink = call();
    spent += now() - started;
    calls += burst;
    await sleep(1);
  }
  return Number(spent) / (calls * per);
}

const generator = await EmbeddedGenerator.start(config);
const flake = new Snowflake(new Date('2026-01-01T00:00:00Z'));
const subjects = {
  'process.hrtime.bigint() (floor)': () => perCall(now),
  'idgen nextIdSync()': () => paced(() => generator.nextIdSync()),
  'idgen await nextId()': () => paced(() => generator.nextId(), { awaited: true }),
  'idgen nextIdSync(), flat out (at the cap)': () => perCall(() => generator.nextIdSync()),
  'crypto.randomUUID()': () => perCall(randomUUID),
  "uuid's v7()": () => perCall(uuidv7),
  "ulid's ulid()": () => perCall(ulid),
  "@sapphire/snowflake generate()": () => perCall(() => flake.generate()),
  'idgen await nextIds(1000), per ID': () => paced(() => generator.nextIds(1000), { per: 1000, burst: 1, awaited: true }),
  'process.hrtime.bigint(), paced (floor)': () => paced(now),
};
let client;
if (worker) {
  client = await Client.connect({ url: worker, prefetch: { batch: 1000, low_water: 250 } });
  const oneRequest = async () => {
    const answer = await fetch(`${worker}/v1/ids`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    return (await answer.json()).id;
  };
  subjects['client await nextId() (prefetched)'] = () => perCallAsync(() => client.nextId());
  subjects['fetch() per ID'] = () => perCallAsync(oneRequest, 0.1);
}

const names = Object.keys(subjects);
const results = Object.fromEntries(names.map((name) => [name, []]));
for (let round = 0; round < rounds; round++) {
  for (const name of [...names.slice(round % names.length), ...names.slice(0, round % names.length)]) {
    results[name].push(await subjects[name]());
  }
}
const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
};
const m = Object.fromEntries(names.map((name) => [name, median(results[name])]));
const floor = m['process.hrtime.bigint() (floor)'];
const ours = m['idgen nextIdSync()'];
console.log(`${''.padEnd(44)} ${'ns/call'.padStart(9)} ${'x floor'.padStart(8)} ${'x idgen'.padStart(8)}   (median of ${rounds} rounds of ${seconds} s)`);
for (const name of names) {
  console.log(`${name.padEnd(44)} ${m[name].toFixed(1).padStart(9)} ${(m[name] / floor).toFixed(2).padStart(8)} ${(m[name] / ours).toFixed(2).padStart(8)}`);
}
if (worker) {
  const ratio = m['fetch() per ID'] / m['client await nextId() (prefetched)'];
  console.log(`the client's prefetched nextId() is ${ratio.toFixed(0)}x as fast as one fetch() per ID`);
  client.close();
}
await generator.close();
