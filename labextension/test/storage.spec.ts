import { afterEach, describe, expect, it } from 'vitest';

import { ApiError, CloudTikApi } from '../src/model';

import {
  BackendSchema,
  buildStorageRequest,
  parentPath,
  storageFieldMatches,
  storageFields,
  StorageModel
} from '../src/storage';

const s3: BackendSchema = {
  backend: 's3',
  description: 'Amazon S3 Compliant Storage Providers',
  providers: ['AWS', 'Rclone'],
  options: [
    { name: 'provider', type: 'string', help: 'Choose your S3 provider.', required: false, advanced: false, secret: false },
    { name: 'access_key_id', type: 'string', help: 'AWS Access Key ID.\nMore.', required: false, advanced: false, secret: true },
    { name: 'secret_access_key', type: 'string', help: 'AWS Secret Access Key.', required: false, advanced: false, secret: true },
    { name: 'endpoint', type: 'string', help: 'Endpoint for S3 API.', required: false, advanced: false, secret: false, default: '' },
    { name: 'force_path_style', type: 'bool', help: 'Path style.', required: false, advanced: true, secret: false, default: true },
    { name: 'upload_concurrency', type: 'int', help: 'Concurrency.', required: false, advanced: true, secret: false, default: 4 },
    {
      name: 'acl', type: 'string', help: 'Canned ACL.', required: false, advanced: false, secret: false,
      exclusive: true, examples: [{ Value: 'private' }, { Value: 'public-read' }]
    }
  ]
};

describe('storage form', () => {
  it('makes secret options password fields, bools checkboxes, exclusive choices selects', () => {
    const fields = storageFields(s3);
    const kind = Object.fromEntries(fields.map(f => [f.name, f.kind]));
    expect(kind).toEqual({
      access_key_id: 'password',
      secret_access_key: 'password',
      endpoint: 'text',
      force_path_style: 'boolean',
      upload_concurrency: 'number',
      acl: 'select'
    });
    expect(fields.find(f => f.name === 'access_key_id')?.help).toBe('AWS Access Key ID.');
    expect(fields.find(f => f.name === 'acl')?.choices).toEqual(['', 'private', 'public-read']);
    expect(fields.find(f => f.name === 'upload_concurrency')?.placeholder).toBe('4');
  });

  it('sends only what was typed, with the provider and read-only by default', () => {
    const fields = storageFields(s3);
    const body = buildStorageRequest(
      ' data ', 's3', 'Rclone', fields,
      { endpoint: 'http://127.0.0.1:9000', secret_access_key: 'sk', force_path_style: false,
        upload_concurrency: '8', acl: '' },
      ' bucket/x ', false
    );
    expect(body).toEqual({
      name: 'data',
      backend: 's3',
      options: { provider: 'Rclone', endpoint: 'http://127.0.0.1:9000', secret_access_key: 'sk',
                 upload_concurrency: 8 },
      source: 'bucket/x',
      read_only: true
    });
    expect(buildStorageRequest('d', 'webdav', '', [], {}, '', true)).toEqual({
      name: 'd', backend: 'webdav', options: {}, read_only: false
    });
  });

  it('maps server fields to form fields and walks up folders', () => {
    expect(storageFieldMatches('endpoint', 'options.endpoint')).toBe(true);
    expect(storageFieldMatches('name', 'name')).toBe(true);
    expect(storageFieldMatches('endpoint', 'options.region')).toBe(false);
    expect(parentPath('a/b/c')).toBe('a/b');
    expect(parentPath('a')).toBe('');
  });
});

/** A stand-in server whose storage list the test changes, counting the requests. */
function server(): CloudTikApi & { calls: number; names: string[]; fail: boolean } {
  const srv = {
    calls: 0,
    names: ['a'],
    fail: false,
    async request(path: string): Promise<any> {
      expect(path).toBe('storages');
      srv.calls += 1;
      if (srv.fail) {
        throw new ApiError('the state folder is locked', 503);
      }
      return { storages: srv.names.map(name => ({ name, backend: 'local', mount: null })) };
    },
    fetcher: async () => new Response('', { status: 200 })
  };
  return srv as any;
}

let stopWatch: (() => void) | null = null;
afterEach(() => stopWatch?.());

describe('StorageModel', () => {
  it('lists, keeps the last error, and polls faster while an operation runs', async () => {
    const srv = server();
    const model = new StorageModel(srv);
    let changes = 0;
    model.onChange(() => (changes += 1));
    await model.refresh();
    expect(model.storages?.map(s => s.name)).toEqual(['a']);
    srv.fail = true;
    await model.refresh();
    expect(model.error).toBe('the state folder is locked');
    expect(model.storages?.map(s => s.name)).toEqual(['a']); // the last good list stays
    expect(changes).toBe(2);
    srv.fail = false;
    srv.names = ['a', 'b'];
    const before = srv.calls;
    stopWatch = model.watch(true); // 1 s ticks while busy
    await new Promise(resolve => setTimeout(resolve, 1300));
    expect(srv.calls).toBe(before + 1);
    expect(model.storages?.map(s => s.name)).toEqual(['a', 'b']);
    stopWatch();
    await new Promise(resolve => setTimeout(resolve, 1100));
    expect(srv.calls).toBe(before + 1); // stopped: no more requests
    model.setError(null);
    expect(model.error).toBeNull();
  });
});
