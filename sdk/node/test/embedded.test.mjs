// The embedded generator from Node: IDs, batches, UUIDs and decode from the Rust core, bad input
// refused with the right error, refusals as IdgenRefusedError, and a closed generator.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import * as idgen from 'idgen-sdk';
import { developmentConfig, increasing, kernelClockSynchronized, scratch } from './support.mjs';

test('IDs as text, bigints, batches, UUIDs, and decode', async (t) => {
  const generator = await idgen.EmbeddedGenerator.start(developmentConfig(scratch(t)));
  try {
    const ids = [];
    for (let i = 0; i < 20_000; i++) ids.push(i % 2 === 0 ? generator.nextIdSync() : await generator.nextId());
    assert.ok(ids.every((id) => typeof id === 'string' && /^[0-9]+$/.test(id)));
    assert.ok(increasing(ids), 'single IDs increase');
    const big = await generator.nextIdBigInt();
    assert.equal(typeof big, 'bigint');
    assert.ok(big > BigInt(ids.at(-1)));
    const batch = await generator.nextIds(1000);
    assert.equal(batch.length, 1000);
    assert.ok(increasing([ids.at(-1), ...batch]));
    const uuids = await generator.nextUuids(50);
    assert.ok(uuids.every((u) => /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(u)));
    assert.deepEqual([...uuids].sort(), uuids);
    assert.equal(new Set(uuids).size, 50);

    const decoded = generator.decode(batch[0]);
    assert.equal(decoded.id, batch[0]);
    assert.ok(['v1', 'v2'].includes(decoded.layout));
    assert.ok(decoded.machine >= 64, 'embedders take machine numbers 64 and up');
    assert.ok(Math.abs(decoded.createdAt.getTime() - Date.now()) < 60_000);
    assert.deepEqual(generator.decode(BigInt(batch[0])), decoded);
    assert.equal(generator.decode(uuids[0]).layout, 'uuidv7');
    assert.ok(generator.region.length > 0 && generator.regionNumber >= 0 && generator.holder.length > 0);
    assert.equal(generator.refusal(), null);
    const metrics = generator.metricsText();
    assert.match(metrics, /idgen_build_info/);
    assert.match(metrics, /role="embedded"/);
  } finally {
    await generator.close();
  }
});

test('calls from many promises at once: every ID once', async (t) => {
  const generator = await idgen.EmbeddedGenerator.start(developmentConfig(scratch(t)));
  try {
    const answers = await Promise.all([
      ...Array.from({ length: 200 }, () => generator.nextId()),
      ...Array.from({ length: 20 }, () => generator.nextIds(500)),
      ...Array.from({ length: 50 }, () => generator.nextIdBigInt().then(String)),
    ]);
    const all = answers.flat();
    assert.equal(all.length, 200 + 20 * 500 + 50);
    assert.equal(new Set(all).size, all.length, 'no ID twice');
  } finally {
    await generator.close();
  }
});

test('bad input is a TypeError or an IdgenInvalidInputError and changes nothing', async (t) => {
  const generator = await idgen.EmbeddedGenerator.start(developmentConfig(scratch(t)));
  try {
    const before = generator.nextIdSync();
    for (const count of [0, -1, idgen.MAX_COUNT + 1, 1.5, Number.NaN, 2 ** 70]) {
      await assert.rejects(generator.nextIds(count), (error) => error instanceof idgen.IdgenInvalidInputError && error.code === 'invalid_count');
    }
    for (const count of ['5', null, undefined, 5n, true]) {
      await assert.rejects(generator.nextUuids(count), TypeError);
    }
    assert.throws(() => generator.decode(1.5), TypeError);
    assert.throws(() => generator.decode(Number(before)), /not a number/);
    assert.throws(() => generator.decode(2n ** 63n), (error) => error.code === 'out_of_range');
    // One family: bad input is a RangeError, an IdgenInvalidInputError and an IdgenError, and the
    // native error it came from is its cause; the other classes are not taken in by it.
    assert.throws(() => generator.decode('12a'), (error) =>
      error instanceof idgen.IdgenInvalidInputError && error instanceof RangeError && error instanceof idgen.IdgenError &&
      !(error instanceof idgen.IdgenRefusedError) && error.cause instanceof Error && error.cause !== error);
    assert.ok(!(new RangeError('x') instanceof idgen.IdgenError));
    assert.throws(() => generator.decode('12a'), (error) => error.code === 'not_an_id');
    assert.ok(BigInt(generator.nextIdSync()) > BigInt(before));
  } finally {
    await generator.close();
  }
});

test('a configuration it cannot use is refused by name', async (t) => {
  const dir = scratch(t);
  // A file that starts a generator, and the same file with one key misspelt: only that key (or
  // the misspelt option, on the good file) can be what is refused.
  const good = developmentConfig(dir);
  const generator = await idgen.EmbeddedGenerator.start(good);
  assert.ok(BigInt(await generator.nextId()) > 0n);
  await generator.close();
  const bad = path.join(dir, 'bad.toml');
  writeFileSync(bad, readFileSync(good, 'utf8').replace('[lease]\n', '[lease]\nstroe = "sqlite"\n'));
  await assert.rejects(idgen.EmbeddedGenerator.start(bad), (error) => error.code === 'invalid_config' && /stroe/.test(error.message));
  await assert.rejects(idgen.EmbeddedGenerator.start(path.join(dir, 'missing.toml')), idgen.IdgenInvalidInputError);
  await assert.rejects(idgen.EmbeddedGenerator.start(good, { readyTimeout: 5 }), (error) =>
    error.code === 'invalid_config' && /readyTimeout/.test(error.message));
  await assert.rejects(idgen.EmbeddedGenerator.start(42), TypeError);
});

test('a clock it cannot trust is a refusal', async (t) => {
  // With the clock check on, the kernel's word decides: this CI machine reports its clock
  // unsynchronized, and then the generator never issues.
  const config = developmentConfig(scratch(t), { clockCheck: true });
  if (kernelClockSynchronized()) {
    const generator = await idgen.EmbeddedGenerator.start(config);
    assert.ok(generator.nextIdSync());
    return generator.close();
  }
  await assert.rejects(idgen.EmbeddedGenerator.start(config, { readyTimeoutMs: 1000 }), (error) => {
    assert.ok(error instanceof idgen.IdgenRefusedError, String(error));
    assert.equal(error.reason, 'clock_unsynchronized');
    assert.ok(error.retryAfterMs > 0);
    return true;
  });
  const generator = await idgen.EmbeddedGenerator.start(config, { readyTimeoutMs: null });
  try {
    await assert.rejects(generator.nextId(), (error) => error instanceof idgen.IdgenRefusedError && ['clock_unsynchronized', 'lease'].includes(error.reason));
    assert.throws(() => generator.nextIdSync(), idgen.IdgenRefusedError);
    await assert.rejects(generator.nextIds(5), idgen.IdgenRefusedError);
    assert.ok(generator.refusal() instanceof idgen.IdgenRefusedError);
  } finally {
    await generator.close();
  }
});

test('a generator never closed releases its lease when the event loop runs dry', async (t) => {
  // One machine number for the whole file: a second generator starts only if the first let it go.
  const config = developmentConfig(scratch(t));
  appendFileSync(config, '[lease.machines.v1]\nfirst = 64\nlast = 64\n[lease.machines.v2]\nfirst = 64\nlast = 64\n');
  const script =
    "import * as idgen from 'idgen-sdk';\n" +
    `const generator = await idgen.EmbeddedGenerator.start(${JSON.stringify(config)});\n` +
    'console.log(await generator.nextId());\n';
  const first = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
  const second = await idgen.EmbeddedGenerator.start(config, { readyTimeoutMs: 5000 });
  try {
    assert.ok(BigInt(await second.nextId()) > BigInt(first.trim()));
  } finally {
    await second.close();
  }
});

test('require() takes the package too (CommonJS, on every Node that engines allows)', () => {
  const script = "const idgen = require('idgen-sdk');\n" +
    "console.log(typeof idgen.EmbeddedGenerator, idgen.version, idgen.decode('120542881919451136').layout);";
  const output = execFileSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(output.trim(), `function ${idgen.version} v1`);
});

test('the version is package.json\'s', () => {
  const installed = JSON.parse(readFileSync(new URL('../node_modules/idgen-sdk/package.json', import.meta.url), 'utf8'));
  assert.equal(idgen.version, installed.version);
  assert.match(idgen.version, /^\d+\.\d+\.\d+/);
});

test('a closed generator refuses', async (t) => {
  const generator = await idgen.EmbeddedGenerator.start(developmentConfig(scratch(t)));
  await generator.close();
  await generator.close();
  await assert.rejects(generator.nextId(), (error) => error instanceof idgen.IdgenError && /closed/.test(error.message));
  assert.throws(() => generator.nextIdSync(), /closed/);
});
