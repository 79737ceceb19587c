import { describe, expect, it } from 'vitest';

import { followStream, SSEMessage, SSEParser } from '../src/sse';

describe('SSEParser', () => {
  it('parses events split across chunks at any byte', () => {
    const text =
      'retry: 1000\n\n: keepalive\n\nid: 7\nevent: progress\ndata: {"a": 1}\n\n' +
      'id: 8\r\nevent: progress\r\ndata: line1\r\ndata: line2\r\n\r\nevent: end\ndata: {}\n\n';
    for (let cut = 1; cut < text.length; cut++) {
      const p = new SSEParser();
      const got = [...p.feed(text.slice(0, cut)), ...p.feed(text.slice(cut))];
      expect(got).toEqual([
        { event: 'progress', id: '7', data: '{"a": 1}' },
        { event: 'progress', id: '8', data: 'line1\nline2' },
        { event: 'end', id: '8', data: '{}' }
      ]);
    }
  });

  it('ignores comments and empty dispatches', () => {
    const p = new SSEParser();
    expect(p.feed(': hello\n\n\n\nevent: x\n\n')).toEqual([]);
  });
});

/** A server that sends `events` and cuts the first connection after `cut` of them. */
function fakeServer(events: number[], cut: number) {
  const requests: Array<string | undefined> = [];
  const fetcher = async (_path: string, init: { headers: Record<string, string> }) => {
    const last = init.headers['Last-Event-ID'];
    requests.push(last);
    const after = last === undefined ? 0 : Number(last);
    let todo = events.filter(id => id > after);
    const first = requests.length === 1;
    if (first) {
      todo = todo.slice(0, cut);
    }
    const body = todo.map(id => `id: ${id}\nevent: progress\ndata: {"id": ${id}}\n\n`).join('');
    const tail = first ? 'id: 999\nevent: progr' : 'event: end\ndata: {}\n\n'; // cut mid-event
    let pulls = 0;
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        pulls += 1;
        if (pulls === 1) {
          controller.enqueue(new TextEncoder().encode(body + tail));
        } else if (first) {
          controller.error(new Error('connection reset')); // after the data was read
        } else {
          controller.close();
        }
      }
    });
    return new Response(stream, { status: 200 });
  };
  return { fetcher, requests };
}

describe('followStream', () => {
  it('resumes after the last event seen, without loss or repeats', async () => {
    const server = fakeServer([3, 4, 5, 6, 7], 2);
    const seen: number[] = [];
    const errors: unknown[] = [];
    await followStream(server.fetcher, 'operations/x/events', new AbortController().signal, {
      after: 2,
      retryMs: 1,
      onError: e => errors.push(e),
      onMessage: (m: SSEMessage) => {
        if (m.event === 'end') {
          return true;
        }
        seen.push(JSON.parse(m.data).id);
      }
    });
    expect(seen).toEqual([3, 4, 5, 6, 7]);
    expect(server.requests).toEqual(['2', '4']);
    expect(errors).toHaveLength(1);
  });

  it('stops when aborted', async () => {
    const controller = new AbortController();
    controller.abort();
    const server = fakeServer([1], 1);
    await followStream(server.fetcher, 'events', controller.signal, { onMessage: () => false });
    expect(server.requests).toEqual([]);
  });
});
