// The fleet client and the public-ID client from Node against the real platform (`idgen up`,
// two regions, one worker each, the v2 cutover a few seconds in so both issue): single, batch
// and UUID IDs; local decode that agrees with the worker's decode endpoint for every ID;
// failover when the home fleet is frozen (SIGSTOP), IDs then from the other region under its
// region number, and the move back; public IDs made and resolved; mutual TLS.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { pbkdf2 } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import * as idgen from 'idgen-sdk';
import { idgenBin, increasing, scratch } from './support.mjs';

function portFree(port) {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/** A base port whose block of twenty (`up` takes P to P+19) is free now. */
async function freeBasePort() {
  for (let base = 41000; base < 60000; base += 20) {
    let free = true;
    for (let port = base; port < base + 20 && free; port++) free = await portFree(port);
    if (free) return base;
  }
  throw new Error('no free block of 20 ports');
}

async function getJson(url) {
  const answer = await fetch(url, { signal: AbortSignal.timeout(5000) });
  if (!answer.ok) throw new Error(`${url}: ${answer.status}`);
  return answer.json();
}

/** `idgen up` with `extra`, its summary once every worker issues; stopped when the test ends. */
async function up(t, extra) {
  const dir = scratch(t);
  const child = spawn(
    idgenBin(),
    ['up', '--workers', '1', ...extra, '--base-port', String(await freeBasePort()), '--dir', path.join(dir, '.idgen'), '--json'],
    { stdio: ['ignore', 'pipe', 'ignore'], env: { ...process.env, RUST_LOG: 'warn' } },
  );
  const exited = new Promise((resolve) => child.once('exit', resolve));
  t.after(async () => {
    for (const pid of children(child.pid)) process.kill(pid, 'SIGCONT');
    child.kill('SIGINT');
    await exited;
  });
  const [line] = await Promise.race([
    (async () => { for await (const l of createInterface({ input: child.stdout })) return [l]; return [null]; })(),
    exited.then(() => [null]),
  ]);
  assert.ok(line, 'idgen up exited before its summary');
  const summary = JSON.parse(line);
  const deadline = Date.now() + 30_000;
  for (const worker of summary.tls_dir === null ? summary.workers : []) {
    for (;;) { // past the cutover, both regions issue (v2 has a region field)
      try {
        if ((await getJson(`${worker.url}/healthz`)).status === 'ok') break;
      } catch {}
      assert.ok(Date.now() < deadline, `${worker.name} never issued`);
      await sleep(100);
    }
  }
  return { summary, pid: child.pid };
}

function children(pid) {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** The `idgen worker` process `up` started for `region`. */
function workerPid(upPid, region) {
  for (const pid of children(upPid)) {
    const command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    if (command.includes('worker') && command.some((part) => part.includes(region))) return pid;
  }
  throw new Error(`no worker of ${region} under ${upPid}`);
}

test('IDs, decode, failover and failback through the real platform', async (t) => {
  const { summary, pid } = await up(t, ['--regions', 'us-east-1,eu-west-1', '--cutover-in', '3s']);
  const [home, other] = summary.workers;
  const client = await idgen.Client.connect({
    url: home.url,
    backups: [other.url],
    registry_url: summary.registry,
    request_timeout_ms: 300,
    probe_interval_ms: 200,
    prefetch: { batch: 50, low_water: 10, validity_ms: 2000 },
  });
  try {
    const ids = [];
    for (let i = 0; i < 120; i++) ids.push(await client.nextId());
    assert.ok(increasing(ids));
    const batch = await client.nextIds(1500);
    assert.equal(batch.length, 1500);
    assert.ok(increasing(batch));
    const uuids = await client.nextUuids(5);
    assert.ok(uuids.every((u) => u[14] === '7'));
    assert.equal(typeof (await client.nextIdBigInt()), 'bigint');
    const homeNumber = client.decode(ids[0]).regionNumber;
    assert.equal(client.decode(ids[0]).region, 'us-east-1');
    assert.equal(client.endpoint, home.url);

    // The home region's fleet frozen: IDs keep coming, from eu-west-1's fleet.
    const frozen = workerPid(pid, 'us-east-1');
    process.kill(frozen, 'SIGSTOP');
    const during = [];
    try {
      for (let i = 0; i < 150; i++) during.push(await client.nextId());
      assert.equal(client.endpoint, other.url);
      const moved = client.decode(during.at(-1));
      assert.equal(moved.region, 'eu-west-1');
      assert.notEqual(moved.regionNumber, homeNumber);
    } finally {
      process.kill(frozen, 'SIGCONT');
    }

    // And back, once the home fleet answers its health probe.
    const deadline = Date.now() + 15_000;
    const after = [];
    while (client.endpoint !== home.url) {
      assert.ok(Date.now() < deadline, 'the client never moved back to the home region');
      after.push(await client.nextId());
      await sleep(20);
    }
    for (let i = 0; i < 60; i++) after.push(await client.nextId());
    assert.equal(client.decode(after.at(-1)).region, 'us-east-1');

    const everything = [...ids, ...batch, ...during, ...after];
    assert.equal(new Set(everything).size, everything.length, 'no ID twice');
    for (const id of [...ids, ...during, ...after]) {
      const ours = client.decode(id);
      assert.deepEqual(client.decode(BigInt(id)), ours);
      const theirs = await getJson(`${home.url}/v1/ids/${id}/decode`);
      assert.deepEqual(
        [theirs.layout, theirs.machine, theirs.sequence, theirs.region_number, theirs.region],
        [ours.layout, ours.machine, ours.sequence, ours.regionNumber, ours.region],
        id,
      );
      assert.ok(theirs.created_at.startsWith(ours.createdAt.toISOString().slice(0, 20)), id);
    }
    assert.match(client.metricsText(), /idgen_client/);
  } finally {
    client.close();
  }
});

test('settings it cannot use, and a fleet that never answers', async () => {
  await assert.rejects(idgen.Client.connect({ url: 'http://127.0.0.1:9', prefetch: { bacth: 5 } }), (error) =>
    error instanceof idgen.IdgenInvalidInputError && error.code === 'invalid_config' && /bacth/.test(error.message));
  await assert.rejects(idgen.Client.connect({ url: 'not a url' }), idgen.IdgenInvalidInputError);
  await assert.rejects(idgen.Client.connect({ url: 'http://127.0.0.1:9', configFile: 'x.toml' }), idgen.IdgenInvalidInputError);
  await assert.rejects(idgen.Client.connect('http://127.0.0.1:9'), TypeError);
  const client = await idgen.Client.connect({ url: 'http://127.0.0.1:9', request_timeout_ms: 200, connect_timeout_ms: 100 });
  await assert.rejects(client.nextId(), (error) => error instanceof idgen.IdgenRefusedError && error.reason === 'unavailable' && error.retryAfterMs > 0);
  client.close();
  await assert.rejects(client.nextId(), /closed/);
});

test('waits on a frozen fleet hold neither the event loop nor libuv\'s thread pool', async (t) => {
  // A fleet that takes connections and never answers: a listening socket nobody accepts from.
  const frozen = net.createServer({ pauseOnConnect: true }, () => {});
  await new Promise((done) => frozen.listen(0, '127.0.0.1', done));
  t.after(() => frozen.close());
  const url = `http://127.0.0.1:${frozen.address().port}`;
  const client = await idgen.Client.connect({ url, request_timeout_ms: 1500, connect_timeout_ms: 500 });
  t.after(() => client.close());
  let ticks = 0;
  const ticker = setInterval(() => { ticks += 1; }, 10);
  const started = performance.now();
  // More waits than libuv has threads (4 by default): before, they took every one of them.
  const waits = Array.from({ length: 6 }, () => client.nextId().then(() => 'issued', (error) => error));
  // crypto.pbkdf2 runs on libuv's pool: it must not queue behind the waits.
  const hashed = performance.now();
  await promisify(pbkdf2)('secret', 'salt', 1000, 32, 'sha256');
  const hashMs = performance.now() - hashed;
  const outcomes = await Promise.all(waits);
  const waitedMs = performance.now() - started;
  clearInterval(ticker);
  for (const outcome of outcomes) {
    assert.ok(outcome instanceof idgen.IdgenRefusedError && outcome.reason === 'unavailable', String(outcome));
  }
  assert.ok(waitedMs >= 1400, `the calls did not wait on the fleet (${waitedMs} ms)`);
  assert.ok(hashMs < 1000, `libuv's pool was held by the waits: a hash took ${hashMs} ms`);
  assert.ok(ticks >= waitedMs / 10 / 2, `${ticks} ticks in ${waitedMs} ms: the event loop was blocked`);
});

async function batchOf(url, count) {
  const answer = await fetch(`${url}/v1/ids:batch`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ count }),
  });
  return (await answer.json()).ids;
}

test('public IDs made, resolved and looked up through the real service', async (t) => {
  const { summary } = await up(t, ['--regions', 'us-east-1,eu-west-1', '--cutover-in', '3s']);
  const internal = await batchOf(summary.workers[0].url, 3);
  const service = new idgen.PublicIds({ url: summary.public_ids, request_timeout_ms: 2000 });

  const opaque = await service.create(internal[0]);
  assert.equal(opaque.created, true);
  assert.equal(opaque.format, 'opaque');
  assert.equal(opaque.publicId.length, 26);
  assert.equal(opaque.internalId, internal[0]);
  const again = await service.create(BigInt(internal[0]));
  assert.equal(again.created, false);
  assert.equal(again.publicId, opaque.publicId, 'one public ID per internal ID and format');
  const found = await service.resolve(opaque.publicId);
  assert.equal(found.internalId, internal[0]);
  assert.equal((await service.lookup(internal[0], { format: 'opaque' })).publicId, opaque.publicId);

  const typed = await service.create(internal[1], { type: 'order' });
  assert.ok(typed.publicId.startsWith('order_'));
  assert.equal(typed.type, 'order');
  assert.equal(idgen.parseTypeid(typed.publicId).prefix, 'order');
  assert.equal((await service.resolve(typed.publicId)).internalId, internal[1]);

  for (const format of ['uuidv7', 'encrypted']) {
    const made = await service.create(internal[2], { format });
    assert.equal((await service.resolve(made.publicId)).internalId, internal[2], format);
  }

  // Forged and unknown look the same: null. Bad input is refused before any call.
  assert.equal(await service.resolve('0'.repeat(26)), null);
  assert.equal(await service.resolve('order_7' + 'z'.repeat(25)), null);
  assert.equal(await service.lookup(String(BigInt(internal[2]) + 1n)), null);
  await assert.rejects(service.create(internal[0], { type: 'no_such_type' }), (error) =>
    error instanceof idgen.IdgenRejectedError && error.status >= 400 && error.status < 500 && error.code.length > 0);
  await assert.rejects(service.create(2n ** 63n), idgen.IdgenInvalidInputError);
  await assert.rejects(service.create(Number(internal[0])), TypeError);
  await assert.rejects(service.resolve(5), TypeError);

  // Closed (by close(), or by Symbol.dispose at the end of a `using` block), it refuses.
  const scoped = new idgen.PublicIds({ url: summary.public_ids, request_timeout_ms: 2000 });
  assert.equal((await scoped.resolve(opaque.publicId)).internalId, internal[0]);
  scoped[Symbol.dispose]();
  service.close();
  for (const closed of [scoped, service]) {
    await assert.rejects(closed.resolve(opaque.publicId), (error) => error instanceof idgen.IdgenError && /closed/.test(error.message));
  }
});

test('mutual TLS with the client certificate up made', async (t) => {
  // `idgen up --tls`: every listener wants a client certificate; the Rust client's `tls` keys
  // from Node: with `orders`' certificate IDs come, without one no ID does.
  const { summary } = await up(t, ['--tls']);
  const tls = summary.tls_dir;
  const url = summary.workers[0].url;
  assert.ok(url.startsWith('https://'));
  const settings = { ca: path.join(tls, 'ca.pem'), cert: path.join(tls, 'orders.pem'), key: path.join(tls, 'orders-key.pem') };
  const client = await idgen.Client.connect({ url, tls: settings, request_timeout_ms: 2000 });
  try {
    const deadline = Date.now() + 30_000;
    let ids;
    for (;;) {
      try {
        ids = await client.nextIds(10);
        break;
      } catch (error) {
        assert.ok(error instanceof idgen.IdgenRefusedError && Date.now() < deadline, `the worker never issued over mutual TLS: ${error}`);
        await sleep(200);
      }
    }
    assert.ok(increasing([...ids, await client.nextId()]));
    const service = new idgen.PublicIds({ url: summary.public_ids, tls: settings, request_timeout_ms: 2000 });
    assert.equal((await service.create(ids[0])).publicId.length, 26);
  } finally {
    client.close();
  }
  const anonymous = await idgen.Client.connect({ url, tls: { ca: path.join(tls, 'ca.pem') }, request_timeout_ms: 500 });
  await assert.rejects(anonymous.nextId(), (error) => error.reason === 'unavailable');
  anonymous.close();
  await assert.rejects(idgen.Client.connect({ url, tls: { cert: path.join(tls, 'orders.pem') } }), idgen.IdgenInvalidInputError);
  assert.ok(readdirSync(tls).includes('ca.pem'));
});
