/**
 * The state behind the Side-kicks section: the hub services a user may run for themselves.
 *
 * Side-kicks only exist under JupyterHub, where this server delegates `hub/...` to the
 * hub's cloudtik sidekick.  `GET hub/whoami` tells which case we are in: a 404 (the
 * server's catch-all) means no hub, and the section stays hidden for good.  The list is
 * cheap and nothing pushes side-kick changes, so it is polled while the section is open
 * and the panel shown, and re-read after every Start / Stop.
 */

import { BadgeKind } from './format';
import { ApiError, CloudTikApi } from './model';
import { Observed, Refresher } from './poll';

export interface SidekickHealth {
  /** wall-clock seconds */
  time: number;
  ok: boolean;
  detail: string;
}

export interface SidekickInstance {
  user: string;
  name: string;
  state: string;
  prefix: string;
  pid: number | null;
  port: number | null;
  restarts: number;
  last_health: SidekickHealth | null;
  started_at: number | null;
  reason: string | null;
  /** an absolute path on the page's origin (the hub's proxy) */
  url: string;
}

export interface Sidekick {
  name: string;
  description: string;
  state: string;
  instance: SidekickInstance | null;
}

export interface WhoAmI {
  name: string;
  groups: string[];
  admin: boolean;
  quota: Record<string, unknown>;
}

export const SIDEKICK_STATES = ['stopped', 'starting', 'running', 'restarting', 'failed'];

export function sidekickBadge(state: string): BadgeKind {
  switch (state) {
    case 'running':
      return 'ok';
    case 'starting':
    case 'stopping':
      return 'busy';
    case 'restarting':
      return 'warn';
    case 'failed':
      return 'error';
    default:
      return 'off';
  }
}

/** Start is offered when nothing runs (a failed side-kick may be started again). */
export function canStart(state: string): boolean {
  return state === 'stopped' || state === 'failed';
}

export function canStop(state: string): boolean {
  return state === 'starting' || state === 'running' || state === 'restarting';
}

/** "healthy, 4s ago" / "unhealthy: no answer within 2s, 4s ago" / "not checked yet". */
export function healthText(health: SidekickHealth | null | undefined, now: number): string {
  if (!health) {
    return 'not checked yet';
  }
  const ago = Math.max(0, Math.round(now - health.time));
  const when = ago < 90 ? `${ago}s ago` : `${Math.round(ago / 60)}m ago`;
  return health.ok ? `healthy, ${when}` : `unhealthy: ${health.detail}, ${when}`;
}

/** The link to open, only while the side-kick runs. */
export function openUrl(s: Sidekick): string | null {
  return s.state === 'running' && s.instance?.url ? s.instance.url : null;
}

export class SidekicksModel extends Observed {
  /** null until whoami answered; false when this server does not delegate to a hub */
  enabled: boolean | null = null;
  whoami: WhoAmI | null = null;
  sidekicks: Sidekick[] = [];
  loaded = false;
  /** the last failed Start / Stop (kept until dismissed) */
  error: string | null = null;
  /** the last failed listing (cleared by the next good one) */
  listError: string | null = null;
  /** Start / Stop requests in flight, by side-kick name */
  readonly pending = new Map<string, 'starting' | 'stopping'>();
  /** should a poll tick read the list? (set to the panel's visibility) */
  isShown: () => boolean = () => true;

  private watchers = 0;
  private readonly poller: Refresher;
  private retry: ReturnType<typeof setTimeout> | null = null;
  private refreshing: Promise<void> | null = null;
  private seq = 0;

  constructor(
    readonly api: CloudTikApi,
    readonly refreshSeconds = 3,
    readonly retrySeconds = 30
  ) {
    super();
    this.poller = new Refresher(() => this.refresh(), {
      seconds: refreshSeconds,
      minSeconds: 0.05,
      isShown: () => this.isShown(),
      name: 'cloudtik:sidekicks'
    });
  }

  /** Ask whether we are under a hub; a 404 ends it, other failures are asked again later. */
  async start(): Promise<void> {
    this.clearRetry();
    try {
      this.whoami = await this.api.request<WhoAmI>('hub/whoami');
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        this.enabled = false;
        this.changed();
        return;
      }
      // the hub's sidekick may be restarting: the section appears once it answers
      this.retry = setTimeout(() => void this.start(), this.retrySeconds * 1000);
      return;
    }
    this.enabled = true;
    this.changed();
    await this.refresh();
    if (this.watchers > 0) {
      this.startTimer();
    }
  }

  /** Poll while someone looks (the open section); returns the function that stops it. */
  watch(): () => void {
    this.watchers += 1;
    if (this.enabled) {
      void this.refresh();
      this.startTimer();
    }
    let done = false;
    return () => {
      if (done) {
        return;
      }
      done = true;
      this.watchers -= 1;
      if (this.watchers <= 0) {
        this.watchers = 0;
        this.stopTimer();
      }
    };
  }

  stop(): void {
    this.stopTimer();
    this.clearRetry();
  }

  private startTimer(): void {
    if (!this.poller.running) {
      this.poller.start();
    }
  }

  private stopTimer(): void {
    this.poller.stop();
  }

  private clearRetry(): void {
    if (this.retry !== null) {
      clearTimeout(this.retry);
      this.retry = null;
    }
  }

  /**
   * Read the list.  A poll during a slow answer joins it; `fresh` (after an action) asks
   * anew, and only the answer to the latest request is kept.
   */
  refresh(fresh = false): Promise<void> {
    if (!this.enabled) {
      return Promise.resolve();
    }
    if (this.refreshing === null || fresh) {
      const seq = ++this.seq;
      const p: Promise<void> = this.load(seq).finally(() => {
        if (this.refreshing === p) {
          this.refreshing = null;
        }
      });
      this.refreshing = p;
    }
    return this.refreshing;
  }

  private async load(seq: number): Promise<void> {
    let data: { sidekicks: Sidekick[] } | null = null;
    let failure: string | null = null;
    try {
      data = await this.api.request<{ sidekicks: Sidekick[] }>('hub/sidekicks');
    } catch (e) {
      failure = `Listing side-kicks failed: ${message(e)}`;
    }
    if (seq !== this.seq) {
      return; // a newer request was made meanwhile: its answer counts
    }
    if (data) {
      this.sidekicks = Array.isArray(data.sidekicks) ? data.sidekicks : [];
    }
    this.listError = failure;
    this.loaded = true;
    this.changed();
  }

  /** The state to show: ours while a request of ours is in flight, else the server's. */
  stateOf(s: Sidekick): string {
    return this.pending.get(s.name) ?? s.state;
  }

  /** Start it (the answer comes once it is healthy, which may take seconds). */
  async startSidekick(name: string): Promise<void> {
    await this.act(name, 'starting', 'POST', 'Starting');
  }

  async stopSidekick(name: string): Promise<void> {
    await this.act(name, 'stopping', 'DELETE', 'Stopping');
  }

  private async act(
    name: string,
    pending: 'starting' | 'stopping',
    method: string,
    verb: string
  ): Promise<void> {
    if (this.pending.has(name)) {
      return;
    }
    this.pending.set(name, pending);
    this.error = null;
    this.changed();
    try {
      await this.api.request(`hub/sidekicks/${encodeURIComponent(name)}`, { method });
    } catch (e) {
      this.error = `${verb} side-kick '${name}' failed: ${message(e)}`;
    } finally {
      this.pending.delete(name);
    }
    this.changed();
    // the request may have waited longer than a poll: read the list again in any case
    await this.refresh(true);
  }

  setError(text: string | null): void {
    this.error = text;
    this.changed();
  }
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
