// The fleet client and public IDs from TypeScript: prefetched IDs from the region's fleet,
// failover to a backup region and back, decode by the registry's schedule, public IDs.
import { Client, PublicIds, type Mapping } from 'idgen-sdk';

const [fleet, backup, publicIds] = process.argv.slice(2);
const client = await Client.connect({
  url: fleet ?? 'http://127.0.0.1:8080',
  backups: backup ? [backup] : [],
  prefetch: { batch: 100, low_water: 25 },
});
try {
  const id: string = await client.nextId();
  const region: string | undefined = client.decode(id).region;
  console.log(id, region, client.endpoint);
  if (publicIds) {
    const service = new PublicIds({ url: publicIds });
    const made: Mapping = await service.create(id, { type: 'order' });
    const back: Mapping | null = await service.resolve(made.publicId);
    console.log(made.publicId, back?.internalId === id);
  }
} finally {
  client.close();
}
