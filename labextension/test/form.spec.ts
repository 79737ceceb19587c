import { describe, expect, it } from 'vitest';

import {
  buildCreateRequest,
  clusterFields,
  coerce,
  fieldMatches,
  initialValues,
  providerFields
} from '../src/form';
import { ProviderInfo } from '../src/types';

const local: ProviderInfo = {
  name: 'local',
  available: true,
  default: true,
  config_schema: {
    type: 'object',
    properties: {
      type: { const: 'local' },
      host: { type: 'string', title: 'Listen address', default: '127.0.0.1' },
      launch_method: { enum: ['fork', 'exec'], title: 'Launch method' },
      nested: { type: 'object' }
    }
  },
  default_node_types: {
    head: { node_config: {}, resources: { CPU: 0 } },
    worker: { node_config: {}, resources: { CPU: 1 }, min_workers: 1, max_workers: 2 }
  }
};

describe('form from a provider schema', () => {
  it('makes fields with defaults, skipping type and nested objects', () => {
    const fields = providerFields(local.config_schema);
    expect(fields.map(f => [f.key, f.kind, f.default])).toEqual([
      ['provider.host', 'string', '127.0.0.1'],
      ['provider.launch_method', 'enum', undefined]
    ]);
    expect(fields[1].options).toEqual(['fork', 'exec']);
  });

  it('caps the default workers at the provider maximum', () => {
    const values = initialValues(clusterFields(local, 8));
    expect(values.workers).toBe(2);
    expect(values.name).toBe('default');
    // a listed cluster's name is not offered: its `up` would be refused as a clash
    expect(initialValues(clusterFields(local, 8, [], ['default'])).name).toBe('default-2');
    expect(initialValues(clusterFields(local, 8, [], ['default', 'default-2'])).name).toBe(
      'default-3'
    );
    expect(values['worker.CPU']).toBe(1);
  });

  it('sends only what differs from the defaults (same config as %cluster up)', () => {
    const fields = clusterFields(local, 2);
    const values = { ...initialValues(fields), name: 'demo', workers: '1' };
    expect(buildCreateRequest(local, fields, values)).toEqual({
      name: 'demo',
      workers: 1,
      config: { provider: { type: 'local' } }
    });
  });

  it('puts changed worker sizes and provider settings into the config', () => {
    const fields = clusterFields(local, 2);
    const values = {
      ...initialValues(fields),
      'worker.CPU': '2',
      'worker.memory': '2GiB',
      'provider.launch_method': 'exec',
      idle_timeout_minutes: '30'
    };
    const req = buildCreateRequest(local, fields, values);
    expect(req.config.provider).toEqual({ type: 'local', launch_method: 'exec' });
    expect(req.config.idle_timeout_minutes).toBe(30);
    expect(req.config.head_node_type).toBe('head');
    expect(req.config.available_node_types.worker.resources).toEqual({ CPU: 2, memory: '2GiB' });
    // the provider's defaults are not changed by building a request
    expect(local.default_node_types!.worker.resources).toEqual({ CPU: 1 });
  });

  it('leaves the worker size to the provider when its defaults declare none', () => {
    const shared = {
      ...local,
      default_node_types: {
        head: { node_config: {}, resources: { CPU: 0 } },
        worker: { node_config: {}, resources: {}, min_workers: 1, max_workers: 8 }
      }
    };
    const fields = clusterFields(shared, 4);
    const values = initialValues(fields);
    expect(values['worker.CPU']).toBe('');
    const cores = fields.find(f => f.key === 'worker.CPU')!;
    expect(cores.placeholder).toBe('empty: provider default');
    expect(cores.description).toMatch(/cores \/ workers/);
    expect(buildCreateRequest(shared, fields, values).config.available_node_types).toBe(
      undefined
    );
    const sized = buildCreateRequest(shared, fields, { ...values, 'worker.memory': '1GiB' });
    expect(sized.config.available_node_types.worker.resources).toEqual({ memory: '1GiB' });
    const one = buildCreateRequest(shared, fields, { ...values, 'worker.CPU': '1' });
    expect(one.config.available_node_types.worker.resources).toEqual({ CPU: 1 });
  });

  it('leaves bad numbers as text so the server names the field', () => {
    const [, workers] = clusterFields(local, 2);
    expect(coerce(workers, 'two')).toBe('two');
    expect(coerce(workers, ' 3 ')).toBe(3);
    expect(coerce(workers, '')).toBeUndefined();
  });

  it('maps server error fields to form fields', () => {
    const byKey = Object.fromEntries(clusterFields(local, 2).map(f => [f.key, f]));
    expect(fieldMatches(byKey.name, 'cluster_name')).toBe(true);
    expect(fieldMatches(byKey.workers, 'available_node_types.worker.min_workers')).toBe(true);
    expect(fieldMatches(byKey['worker.memory'], 'available_node_types.worker.resources.memory'))
      .toBe(true);
    expect(fieldMatches(byKey['provider.host'], 'provider.host')).toBe(true);
    expect(fieldMatches(byKey['provider.host'], 'cluster_name')).toBe(false);
  });

  it('offers the installed runtimes, and all of them together', () => {
    expect(clusterFields(local, 2, ['dask']).some(f => f.key === 'runtime')).toBe(false);
    const fields = clusterFields(local, 2, ['dask', 'spark']);
    const runtime = fields.find(f => f.key === 'runtime')!;
    expect(runtime.kind).toBe('enum');
    expect(runtime.options).toEqual(['dask', 'spark', 'dask,spark']);
    expect(runtime.default).toBe('dask');
    // the default runtime adds nothing: the same config as %cluster up
    expect(buildCreateRequest(local, fields, initialValues(fields)).config.runtime).toBeUndefined();
    const spark = { ...initialValues(fields), runtime: 'spark' };
    expect(buildCreateRequest(local, fields, spark).config.runtime).toEqual({ types: ['spark'] });
    const both = { ...initialValues(fields), runtime: 'dask,spark' };
    expect(buildCreateRequest(local, fields, both).config.runtime).toEqual({
      types: ['dask', 'spark']
    });
    expect(fieldMatches(runtime, 'runtime.types.0')).toBe(true);
  });
});
