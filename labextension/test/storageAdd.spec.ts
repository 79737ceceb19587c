import { describe, expect, it } from 'vitest';

import {
  askedFieldMatches,
  buildAddBody,
  missingValue,
  readStorageAdd,
  summaryRows
} from '../src/storageAdd';

const shown = {
  version: 1,
  request: {
    name: 'data',
    backend: null,
    options: { provider: 'Rclone', endpoint: 'http://127.0.0.1:9000' },
    url: 's3://bucket/x',
    source: null,
    read_only: true,
    mount_path: null,
    vfs_cache_mode: null,
    description: '',
    replace: false
  },
  ask: ['access_key_id', 'secret_access_key'],
  secret: ['access_key_id', 'secret_access_key'],
  storage: {
    backend: 's3',
    source: 'bucket/x',
    access: 'read-only',
    mount_path: '/home/u/storage/data',
    options: {
      provider: 'Rclone',
      endpoint: 'http://127.0.0.1:9000',
      access_key_id: '<secret>',
      secret_access_key: '<secret>'
    }
  },
  timeout: 900
};

describe("%storage add's form", () => {
  it('reads what the kernel sent, and nothing else', () => {
    const data = readStorageAdd(shown);
    expect(data?.request.name).toBe('data');
    expect(data?.ask).toEqual(['access_key_id', 'secret_access_key']);
    expect(readStorageAdd(null)).toBeNull();
    expect(readStorageAdd({ ...shown, version: 2 })).toBeNull();
    expect(readStorageAdd({ ...shown, ask: [3] })).toBeNull();
    expect(readStorageAdd({ ...shown, request: { options: {} } })).toBeNull();
    expect(readStorageAdd({ ...shown, request: { ...shown.request, options: 'x' } })).toBeNull();
    // "secret" only names asked keys
    expect(readStorageAdd({ ...shown, secret: ['endpoint', 'access_key_id'] })?.secret).toEqual([
      'access_key_id'
    ]);
  });

  it('shows where the values go, without the asked ones', () => {
    const rows = summaryRows(readStorageAdd(shown)!);
    expect(rows).toEqual([
      ['backend', 's3'],
      ['source', 'bucket/x'],
      ['access', 'read-only'],
      ['mount path', '/home/u/storage/data'],
      ['option provider', 'Rclone'],
      ['option endpoint', 'http://127.0.0.1:9000']
    ]);
    const replacing = summaryRows(readStorageAdd({ ...shown, request: { ...shown.request, replace: true } })!);
    expect(replacing[replacing.length - 1]).toEqual(['replace', 'yes: storage data is replaced']);
  });

  it("posts the kernel's request with the typed values, and only StorageCreate's fields", () => {
    const data = readStorageAdd({
      ...shown,
      request: { ...shown.request, ask: ['x'], dry_run: true, evil: 1 }
    })!;
    const body = buildAddBody(data, { access_key_id: 'AK', secret_access_key: 'SK' });
    expect(body).toEqual({
      name: 'data',
      url: 's3://bucket/x',
      read_only: true,
      description: '',
      replace: false,
      options: {
        provider: 'Rclone',
        endpoint: 'http://127.0.0.1:9000',
        access_key_id: 'AK',
        secret_access_key: 'SK'
      }
    });
    // the data the output holds is not changed by what was typed
    expect(data.request.options).toEqual(shown.request.options);
  });

  it('wants every asked value, and marks the field the server names', () => {
    const data = readStorageAdd(shown)!;
    expect(missingValue(data, { access_key_id: 'AK' })).toBe('secret_access_key');
    expect(missingValue(data, { access_key_id: 'AK', secret_access_key: 'SK' })).toBeNull();
    expect(askedFieldMatches('secret_access_key', 'options.secret_access_key')).toBe(true);
    expect(askedFieldMatches('secret_access_key', 'name')).toBe(false);
  });
});
