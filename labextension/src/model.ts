/**
 * The state behind the Clusters section: clusters, providers, running operations.
 *
 * It talks to the server through a small `CloudTikApi` interface (implemented with
 * JupyterLab's ServerConnection in api.ts), so it can be tested against any server.
 * Progress is pushed: one event stream of all operations keeps the rows live and
 * triggers a refresh of the (cheap) cluster list when something changed.
 */

import { Fetcher, followStream, SSEMessage } from './sse';
import { OperationRow, OperationTracker } from './operations';
import { Accepted, CloudTikEvent, Cluster, Operation, ProviderInfo } from './types';
import { Observed, Refresher } from './poll';
import { UsageSample } from './usage';

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly reason: string | null = null,
    readonly field: string | null = null
  ) {
    super(message);
  }
}

export interface CloudTikApi {
  /** JSON request to `cloudtik/api/<path>`; rejects with ApiError carrying the server's message */
  request<T = any>(path: string, init?: { method?: string; body?: unknown }): Promise<T>;
  /** raw fetch for event streams */
  fetcher: Fetcher;
}

/** Turn an HTTP error answer into an ApiError with the server's own message. */
export async function errorFromResponse(response: Response): Promise<ApiError> {
  let body: any = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  const message =
    body && typeof body.message === 'string'
      ? body.message
      : `the server answered HTTP ${response.status}`;
  return new ApiError(message, response.status, body?.reason ?? null, body?.field ?? null);
}

export type Listener = () => void;
export type EventListener = (event: CloudTikEvent) => void;

export class ClustersModel extends Observed {
  clusters: Cluster[] = [];
  providers: ProviderInfo[] = [];
  /** The installed runtimes (the server's `providers` answer): the form's Runtime field. */
  runtimes: string[] = [];
  defaultProvider = 'local';
  readonly ops = new OperationTracker();
  /** the last error to show (the server's message) */
  error: string | null = null;
  /** is the live event stream connected? */
  live = false;
  loaded = false;

  private eventListeners = new Set<EventListener>();
  private abort: AbortController | null = null;
  private readonly poller = new Refresher(() => this.refresh(), {
    seconds: 10,
    soonMs: 250,
    name: 'cloudtik:clusters'
  });

  constructor(readonly api: CloudTikApi) {
    super();
  }

  /** Every event of the stream, for sections that follow other operations (jobs). */
  onEvent(listener: EventListener): () => void {
    this.eventListeners.add(listener);
    return () => this.eventListeners.delete(listener);
  }

  /** Load everything, follow events, and refresh every `refreshSeconds` (ages, states). */
  async start(refreshSeconds = 10): Promise<void> {
    this.stop();
    this.abort = new AbortController();
    const opsList = await this.guard(() =>
      this.api.request<{ operations: Operation[]; last_event_id: number }>(
        'operations?active=true'
      )
    );
    const after = opsList?.last_event_id ?? null;
    for (const op of opsList?.operations ?? []) {
      this.ops.addOperation(op);
      void this.catchUp(op.id);
    }
    await Promise.all([this.refresh(), this.loadProviders()]);
    this.loaded = true;
    this.changed();
    void followStream(this.api.fetcher, 'events', this.abort.signal, {
        after,
        onOpen: () => {
          this.live = true;
          this.changed();
        },
        onError: () => {
          this.live = false;
          this.changed();
        },
        onMessage: message => this.onMessage(message)
      });
    this.setRefresh(refreshSeconds);
  }

  setRefresh(seconds: number): void {
    this.poller.start(seconds);
  }

  stop(): void {
    this.abort?.abort();
    this.abort = null;
    this.poller.stop();
  }

  onMessage(message: SSEMessage): void {
    if (message.event !== 'progress') {
      return;
    }
    const event = JSON.parse(message.data) as CloudTikEvent;
    for (const listener of [...this.eventListeners]) {
      listener(event);
    }
    const row = this.ops.apply(event);
    if (!row) {
      return;
    }
    if (this.ops.needsDetails(row)) {
      void this.details(row);
    }
    if (['head', 'workers', 'terminate', 'ready', 'start'].includes(event.step) ||
        row.finishedAt !== null) {
      this.queueRefresh();
    }
    this.changed();
  }

  private async details(row: OperationRow): Promise<void> {
    const op = await this.guard(() => this.api.request<Operation>(`operations/${row.id}`));
    if (op) {
      this.ops.addOperation(op);
      this.changed();
    }
  }

  /** The events an operation had before we connected (applied once, like any other). */
  private async catchUp(opId: string): Promise<void> {
    const data = await this.guard(() =>
      this.api.request<{ events: CloudTikEvent[] }>(`operations/${opId}/events`)
    );
    for (const event of data?.events ?? []) {
      this.ops.apply(event);
    }
    this.changed();
  }

  private queueRefresh(): void {
    this.poller.soon();
  }

  async refresh(): Promise<void> {
    const data = await this.guard(() => this.api.request<{ clusters: Cluster[] }>('clusters'));
    if (data) {
      this.clusters = data.clusters;
      this.changed();
    }
  }

  async loadProviders(): Promise<void> {
    const data = await this.guard(() =>
      this.api.request<{
        providers: ProviderInfo[];
        default_provider: string;
        runtimes?: string[];
      }>('providers')
    );
    if (data) {
      this.providers = data.providers;
      this.runtimes = data.runtimes ?? [];
      this.defaultProvider = data.default_provider;
    }
  }

  /** Start a cluster; the operation's row appears at once. Rejects with the server's error. */
  async create(body: unknown): Promise<Accepted> {
    return this.accepted(await this.api.request<Accepted>('clusters', { method: 'POST', body }));
  }

  async scale(name: string, workers: number): Promise<Accepted> {
    return this.accepted(
      await this.api.request<Accepted>(`clusters/${encodeURIComponent(name)}`, {
        method: 'PATCH',
        body: { workers }
      })
    );
  }

  /** Adaptive scaling between minimum and maximum workers, run by the server. */
  async adapt(name: string, minimum: number, maximum: number): Promise<unknown> {
    return this.api.request(`clusters/${encodeURIComponent(name)}/adapt`, {
      method: 'PUT',
      body: { minimum, maximum }
    });
  }

  /** Cost so far, cost per hour and the size/price samples of the cluster's life. */
  async usage(name: string): Promise<Usage> {
    return this.api.request<Usage>(`clusters/${encodeURIComponent(name)}/usage`);
  }

  async adaptOff(name: string): Promise<unknown> {
    return this.api.request(`clusters/${encodeURIComponent(name)}/adapt`, { method: 'DELETE' });
  }

  async shutdown(name: string): Promise<Accepted> {
    return this.accepted(
      await this.api.request<Accepted>(`clusters/${encodeURIComponent(name)}`, {
        method: 'DELETE'
      })
    );
  }

  async cancel(opId: string): Promise<void> {
    const op = await this.api.request<Operation>(`operations/${opId}`, { method: 'DELETE' });
    this.ops.addOperation(op);
    this.changed();
  }

  private accepted(result: Accepted): Accepted {
    this.error = null;
    this.ops.addOperation(result.operation);
    void this.catchUp(result.operation.id);
    this.queueRefresh();
    this.changed();
    return result;
  }

  setError(message: string | null): void {
    this.error = message;
    this.changed();
  }

  /** Run a request; on failure keep the server's message for display and return null. */
  private async guard<T>(call: () => Promise<T>): Promise<T | null> {
    try {
      return await call();
    } catch (e) {
      this.setError(e instanceof Error ? e.message : String(e));
      return null;
    }
  }
}

export interface Usage {
  cluster: string;
  cost_so_far: number;
  cost_per_hour: number | null;
  currency: string;
  samples: UsageSample[];
}
