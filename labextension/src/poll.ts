/**
 * The panel's models observe and poll through this module only.
 *
 * `Observed` is the change signal every model has (`onChange` for the views, `changed()`
 * for the model).  The one poll helper of the panel's models: Lumino's `Poll` ticks every `seconds`, stands
 * by while the page is hidden (and while `isShown` says nobody looks), and backs off after
 * failed ticks; `soon()` asks for one refresh after a short wait, however many events ask
 * (Lumino's trailing `Throttler`), for events that mean the data moved.  Each model keeps
 * one `Refresher` instead of its own intervals and timeouts.
 */
import { Poll, Throttler } from '@lumino/polling';

export class Observed {
  private listeners = new Set<() => void>();

  /** Call `listener` after every change; returns the function that stops it. */
  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  protected changed(): void {
    for (const listener of [...this.listeners]) {
      listener();
    }
  }
}

export interface RefresherOptions {
  /** seconds between ticks (`start(seconds)` changes it) */
  seconds: number;
  /** the shortest interval allowed, in seconds (default 1) */
  minSeconds?: number;
  /** how long `soon()` waits for more events, in ms (default 250) */
  soonMs?: number;
  /** false while nobody can see what is refreshed: ticks stand by */
  isShown?: () => boolean;
  /** the poll's name, for debugging */
  name?: string;
}

export class Refresher {
  private poll: Poll | null = null;
  private readonly throttler: Throttler;
  private seconds: number;

  constructor(
    private readonly tick: () => Promise<unknown>,
    private readonly options: RefresherOptions
  ) {
    this.seconds = options.seconds;
    this.throttler = new Throttler(() => this.tick(), {
      limit: options.soonMs ?? 250,
      edge: 'trailing'
    });
  }

  /** is the periodic tick on? */
  get running(): boolean {
    return this.poll !== null;
  }

  /** Tick every `seconds` from now on; the first tick is one interval away (the caller
   *  has just loaded). */
  start(seconds: number = this.seconds): void {
    this.stop();
    this.seconds = seconds;
    const interval = Math.max(seconds, this.options.minSeconds ?? 1) * 1000;
    const isShown = this.options.isShown;
    const poll = new Poll({
      auto: false,
      factory: () => this.tick(),
      frequency: { interval, backoff: true, max: Math.max(interval * 10, 60_000) },
      standby: () => (isShown !== undefined && !isShown()) || 'when-hidden',
      name: this.options.name
    });
    this.poll = poll;
    void poll.schedule({ interval, phase: 'started' });
  }

  stop(): void {
    this.poll?.dispose();
    this.poll = null;
  }

  /** One refresh shortly, for a burst of events. */
  soon(): void {
    this.throttler.invoke().catch(() => undefined);
  }

  dispose(): void {
    this.stop();
    this.throttler.dispose();
  }
}
