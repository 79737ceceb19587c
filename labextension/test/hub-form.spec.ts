import { describe, expect, it } from 'vitest';

import { buildCreateRequest, clusterFields, initialValues, isCatalogEntry } from '../src/form';
import { ProviderInfo } from '../src/types';

const schema = {
  type: 'object',
  properties: {
    type: { const: 'local' },
    host: { type: 'string', title: 'Listen address', default: '127.0.0.1' }
  }
};
const nodeTypes = {
  head: { node_config: {}, resources: { CPU: 0 } },
  worker: { node_config: {}, resources: { CPU: 1 }, min_workers: 0, max_workers: 4 }
};

/** A hub catalogue entry as the sidekick lists it under `providers`. */
const pool: ProviderInfo = {
  name: 'local-pool',
  available: true,
  default: false,
  kind: 'provider',
  provider_type: 'local',
  title: 'local-pool (local provider)',
  description: 'Shared pool of the physics group',
  config_schema: schema,
  default_node_types: nodeTypes
};

describe('New form with a hub catalogue entry', () => {
  it('knows catalogue entries by their kind', () => {
    expect(isCatalogEntry(pool)).toBe(true);
    expect(isCatalogEntry({ ...pool, kind: 'template' })).toBe(true);
    const { kind: _kind, ...plain } = pool;
    expect(isCatalogEntry(plain)).toBe(false);
    expect(isCatalogEntry({ ...pool, kind: '' })).toBe(false);
  });

  it('has no provider settings fields (the admin set them), only the cluster ones', () => {
    const keys = clusterFields(pool, 2).map(f => f.key);
    expect(keys).toEqual(['name', 'workers', 'worker.CPU', 'worker.memory',
      'idle_timeout_minutes']);
    const { kind: _kind, ...plain } = pool;
    expect(clusterFields(plain, 2).map(f => f.key)).toContain('provider.host');
  });

  it('sends just the choice as provider', () => {
    const fields = clusterFields(pool, 2);
    const values = { ...initialValues(fields), name: 'br1', workers: '1' };
    expect(buildCreateRequest(pool, fields, values)).toEqual({
      name: 'br1',
      workers: 1,
      config: { provider: { type: 'local-pool' } }
    });
  });
});
