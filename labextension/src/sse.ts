/**
 * Server-Sent Events over fetch: a parser and a reconnecting reader.
 *
 * fetch (through JupyterLab's ServerConnection) is used instead of EventSource so the
 * request carries the same authentication as every other call, and so reconnecting can
 * say exactly where to resume (`Last-Event-ID`: the id of the last event applied).
 */

export interface SSEMessage {
  event: string;
  id: string | null;
  data: string;
}

/** Incremental parser: feed it text chunks as they arrive, get whole messages back. */
export class SSEParser {
  private buffer = '';
  private event = 'message';
  private id: string | null = null;
  private data: string[] = [];

  feed(chunk: string): SSEMessage[] {
    this.buffer += chunk;
    const out: SSEMessage[] = [];
    let newline: number;
    while ((newline = this.buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = this.buffer.slice(0, newline);
      const width = this.buffer.startsWith('\r\n', newline) ? 2 : 1;
      // a lone '\r' at the end may be the first half of '\r\n': wait for more
      if (width === 1 && this.buffer[newline] === '\r' && newline === this.buffer.length - 1) {
        break;
      }
      this.buffer = this.buffer.slice(newline + width);
      const message = this.line(line);
      if (message) {
        out.push(message);
      }
    }
    return out;
  }

  private line(line: string): SSEMessage | null {
    if (line === '') {
      if (this.data.length === 0) {
        this.event = 'message';
        return null;
      }
      const message = { event: this.event, id: this.id, data: this.data.join('\n') };
      this.event = 'message';
      this.data = [];
      return message;
    }
    if (line.startsWith(':')) {
      return null; // comment (keep-alive)
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) {
      value = value.slice(1);
    }
    if (field === 'event') {
      this.event = value;
    } else if (field === 'data') {
      this.data.push(value);
    } else if (field === 'id') {
      this.id = value;
    }
    return null;
  }
}

export type Fetcher = (
  path: string,
  init: { headers: Record<string, string>; signal: AbortSignal }
) => Promise<Response>;

export interface StreamOptions {
  /** where to start: events with a larger id are delivered */
  after?: number | null;
  /** called for every message; return true to stop the stream */
  onMessage: (message: SSEMessage) => boolean | void;
  /** called when a connection failed or dropped (before the retry) */
  onError?: (error: unknown) => void;
  /** called when a connection is (re)established */
  onOpen?: () => void;
  retryMs?: number;
}

/**
 * Follow an event stream until `onMessage` says stop or the signal aborts; reconnects
 * after errors, resuming after the last event id seen.
 */
export async function followStream(
  fetcher: Fetcher,
  path: string,
  signal: AbortSignal,
  options: StreamOptions
): Promise<void> {
  let last = options.after ?? null;
  const retry = options.retryMs ?? 1000;
  while (!signal.aborted) {
    const headers: Record<string, string> = { Accept: 'text/event-stream' };
    if (last !== null) {
      headers['Last-Event-ID'] = String(last);
    }
    try {
      const response = await fetcher(path, { headers, signal });
      if (!response.ok || !response.body) {
        throw new Error(`event stream answered HTTP ${response.status}`);
      }
      options.onOpen?.();
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      const parser = new SSEParser();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          break;
        }
        for (const message of parser.feed(decoder.decode(value, { stream: true }))) {
          if (message.id !== null && /^\d+$/.test(message.id)) {
            last = Number(message.id);
          }
          if (options.onMessage(message) === true) {
            await reader.cancel();
            return;
          }
        }
      }
    } catch (error) {
      if (signal.aborted) {
        return;
      }
      options.onError?.(error);
    }
    if (signal.aborted) {
      return;
    }
    await new Promise(resolve => setTimeout(resolve, retry));
  }
}
