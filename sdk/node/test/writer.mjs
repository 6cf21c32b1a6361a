// One process of the shared-lease test (sdk/python/tests/test_embedded.py): an embedded
// generator on the configuration given, writing its IDs to a file, one per line, for a while.
//   node writer.mjs CONFIG OUT SECONDS

import { openSync, writeSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

import { EmbeddedGenerator } from 'idgen-sdk';

const [config, out, seconds] = process.argv.slice(2);
const generator = await EmbeddedGenerator.start(config, { readyTimeoutMs: 30_000 });
const file = openSync(out, 'w');
console.log('ready');
const deadline = Date.now() + Number(seconds) * 1000;
while (Date.now() < deadline) {
  const ids = await generator.nextIds(200);
  ids.push(await generator.nextId(), generator.nextIdSync());
  writeSync(file, ids.join('\n') + '\n');
  await sleep(2);
}
await generator.close();
