// The embedded generator from TypeScript: IDs in-process, on a lease of the process's own.
// Run in the package's tests (compiled by tsc --strict, run against a development generator).
import { EmbeddedGenerator, IdgenRefusedError, type Decoded } from 'idgen-sdk';

const generator = await EmbeddedGenerator.start(process.argv[2] ?? 'generator.toml');
try {
  const one: string = await generator.nextId(); // a string: a JavaScript number is exact only to 2^53
  const now: string = generator.nextIdSync();
  const big: bigint = await generator.nextIdBigInt();
  const batch: string[] = await generator.nextIds(1000);
  const uuids: string[] = await generator.nextUuids(2);
  const decoded: Decoded = generator.decode(big);
  console.log(one, now, batch.length, uuids[0], decoded.layout, decoded.createdAt.toISOString(), decoded.machine);
} catch (error) {
  if (error instanceof IdgenRefusedError) {
    // No ID now (the lease, the clock): wait as it says and try again, never make one up.
    console.error(`refused (${error.reason}); retry in ${error.retryAfterMs ?? 'a while'} ms`);
  }
  throw error;
} finally {
  await generator.close();
}
