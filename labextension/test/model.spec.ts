import { afterEach, describe, expect, it } from 'vitest';

import { ApiError, ClustersModel, CloudTikApi, errorFromResponse } from '../src/model';
import { badgeKind, clientCode, formatAge, formatBytes } from '../src/format';

/** A stand-in server for the model: answers from a table, records what was asked. */
function api(answers: Record<string, unknown>): CloudTikApi & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    async request(path: string, init: { method?: string; body?: unknown } = {}) {
      const key = `${init.method ?? 'GET'} ${path}`;
      calls.push(key);
      const answer = answers[key];
      if (answer instanceof ApiError) {
        throw answer;
      }
      if (answer === undefined) {
        throw new ApiError(`no answer for ${key}`, 404);
      }
      return answer as any;
    },
    fetcher: async () => new Response(new ReadableStream({ start() {} }), { status: 200 })
  };
}

let model: ClustersModel | null = null;
afterEach(() => model?.stop());

describe('ClustersModel', () => {
  it('keeps the server message of a refused request and shows the new operation', async () => {
    const server = api({
      'POST clusters': new ApiError("cluster_name: 'X' is not allowed", 400, 'invalid', 'name'),
      'GET clusters': { clusters: [] }
    });
    model = new ClustersModel(server);
    await expect(model.create({ name: 'X' })).rejects.toThrow("'X' is not allowed");
    server.request = async (path: string, init: any = {}) => {
      server.calls.push(`${init.method ?? 'GET'} ${path}`);
      if (path === 'clusters' && init.method === 'POST') {
        return {
          cluster: 'demo',
          operation: { id: 'op9', kind: 'cluster.up', target: 'cluster:demo',
                       resource: { kind: 'cluster', name: 'demo' }, state: 'running',
                       reason: null, cancel_requested: false, created_at: 1, finished_at: null }
        };
      }
      return path.endsWith('/events') ? { events: [] } : { clusters: [] };
    };
    await model.create({ name: 'demo' });
    expect(model.ops.rows.get('op9')!.cluster).toBe('demo');
    expect(model.error).toBeNull();
  });

  it('applies pushed events and refreshes the list when an operation ends', async () => {
    const server = api({ 'GET clusters': { clusters: [] } });
    model = new ClustersModel(server);
    let changes = 0;
    model.onChange(() => changes++);
    model.onMessage({ event: 'progress', id: '1', data: JSON.stringify({
      id: 1, op_id: 'a', ts: 1, step: 'start', message: 'cluster.down cluster:demo',
      fraction: 0, level: 'info',
      data: { kind: 'cluster.down', resource: { kind: 'cluster', name: 'demo' } } }) });
    model.onMessage({ event: 'progress', id: '2', data: JSON.stringify({
      id: 2, op_id: 'a', ts: 2, step: 'succeeded', message: 'done', fraction: 1,
      level: 'info', data: {} }) });
    model.onMessage({ event: 'progress', id: '2', data: '{"id": 2, "op_id": "a"}' });
    expect(changes).toBe(2);
    expect(model.ops.rows.get('a')!.state).toBe('succeeded');
    await new Promise(r => setTimeout(r, 400));
    expect(server.calls).toContain('GET clusters');
  });

  it('reads the error body of an HTTP answer', async () => {
    const e = await errorFromResponse(new Response(
      JSON.stringify({ message: 'no cluster named x', reason: 'not_found', field: 'name' }),
      { status: 404 }));
    expect([e.message, e.status, e.reason, e.field]).toEqual(
      ['no cluster named x', 404, 'not_found', 'name']);
    const plain = await errorFromResponse(new Response('<html>', { status: 502 }));
    expect(plain.message).toBe('the server answered HTTP 502');
  });
});

describe('formatting', () => {
  it('formats like the notebook table', () => {
    expect(formatBytes(2 * 1024 ** 3)).toBe('2.0 GiB');
    expect(formatBytes(12 * 1024 ** 3)).toBe('12 GiB');
    expect(formatAge(30)).toBe('30s');
    expect(formatAge(600)).toBe('10m');
    expect(badgeKind('running')).toBe('ok');
    expect(badgeKind('failed')).toBe('error');
    expect(clientCode('a"b')).toContain('Cluster.get("a\\"b")');
  });
});
