/**
 * The panel's list of this server's HPC kernels (`GET hpc/kernels`: queued and why, the
 * node, the wall time left, why one died), for the "HPC kernels" section.
 *
 * Why beside the toolbar item (kernelQueue.ts): the toolbar shows the kernel of the notebook
 * in front; a user with several notebooks, or one closed while its kernel's job waits in
 * the queue, needs every kernel's job in one place, and a way to end one (which ends its
 * batch job) without finding its notebook first.
 */
import { FAST_SECONDS, HpcKernel, isHpcKernelName, SLOW_SECONDS } from './hpcKernels';
import { ApiError, CloudTikApi } from './model';
import { Observed, Refresher } from './poll';

/** An HPC kernel as the panel lists it: `notebook` is the path under the server's root
 *  of the notebook it was started for, when it is under the root. */
export interface ListedHpcKernel extends HpcKernel {
  notebook?: string | null;
}

const ORDER: Record<string, number> = { submitting: 0, queued: 1, running: 2, dead: 3 };

/** Live kernels first (being submitted, queued, running), then the dead, newest first. */
export function sortKernels(kernels: ListedHpcKernel[]): ListedHpcKernel[] {
  return [...kernels].sort(
    (a, b) =>
      (ORDER[a.state] ?? 4) - (ORDER[b.state] ?? 4) ||
      Number(!!a.orphaned) - Number(!!b.orphaned) ||
      (b.time ?? 0) - (a.time ?? 0)
  );
}

/** Is any kernel waiting for something the user wants to see change soon? */
export function involved(kernels: HpcKernel[]): boolean {
  return kernels.some(k => k.state === 'submitting' || k.state === 'queued');
}

/** Can the user end it from the panel?  Not a dead one, nor a killed server's. */
export function canShutDown(k: ListedHpcKernel): boolean {
  return k.state !== 'dead' && !k.orphaned;
}

/** Does this server offer HPC kernels at all (a kernel spec of ours)? */
export function offersHpcKernels(specNames: Iterable<string>): boolean {
  for (const name of specNames) {
    if (isHpcKernelName(name)) {
      return true;
    }
  }
  return false;
}

export class HpcKernelsModel extends Observed {
  kernels: ListedHpcKernel[] = [];
  loaded = false;
  /** the last failed listing or shutdown (cleared by the next good listing) */
  error: string | null = null;
  /** kernels being shut down */
  readonly pending = new Set<string>();
  /** should a poll tick read the list? (set to the panel's visibility) */
  isShown: () => boolean = () => true;

  private readonly poller: Refresher;
  private watchers = 0;
  private seconds = SLOW_SECONDS;

  constructor(
    readonly api: CloudTikApi,
    /** ends a kernel the way JupyterLab does (`DELETE /api/kernels/{id}`) */
    private readonly shutdownKernel: (id: string) => Promise<void>,
    /** the names of the server's kernel specs (HPC ones start with `cloudtik-hpc-`) */
    private readonly specNames: () => Iterable<string>
  ) {
    super();
    this.poller = new Refresher(() => this.refresh(), {
      seconds: SLOW_SECONDS,
      isShown: () => this.isShown(),
      name: 'cloudtik:hpc-kernels'
    });
  }

  /** The section is there when the server offers HPC kernels or has some. */
  get visible(): boolean {
    return this.kernels.length > 0 || offersHpcKernels(this.specNames());
  }

  /** The kernel specs changed (JupyterLab's kernelspecs signal). */
  specsChanged(): void {
    this.changed();
  }

  async refresh(): Promise<void> {
    try {
      const answer = await this.api.request<{ kernels: ListedHpcKernel[] }>('hpc/kernels');
      this.kernels = sortKernels(answer.kernels ?? []);
      this.error = null;
    } catch (e) {
      // a server without the HPC feature answers 404: nothing to list, nothing wrong
      if (e instanceof ApiError && e.status === 404) {
        this.kernels = [];
        this.error = null;
      } else {
        this.error = `Could not list the HPC kernels: ${(e as Error).message}`;
      }
    }
    this.loaded = true;
    const seconds = involved(this.kernels) ? FAST_SECONDS : SLOW_SECONDS;
    if (this.watchers > 0 && (seconds !== this.seconds || !this.poller.running)) {
      this.seconds = seconds;
      this.poller.start(seconds);
    }
    this.changed();
  }

  /** Poll while someone looks (the open section); returns the function that stops it. */
  watch(): () => void {
    this.watchers += 1;
    void this.refresh();
    let done = false;
    return () => {
      if (done) {
        return;
      }
      done = true;
      this.watchers = Math.max(0, this.watchers - 1);
      if (this.watchers === 0) {
        this.poller.stop();
      }
    };
  }

  /** End a kernel (and so its batch job); the list is read again after. */
  async shutdown(id: string): Promise<void> {
    this.pending.add(id);
    this.changed();
    try {
      await this.shutdownKernel(id);
    } catch (e) {
      this.error = `Could not shut down kernel ${id}: ${(e as Error).message}`;
    } finally {
      this.pending.delete(id);
    }
    const failed = this.error;
    await this.refresh();
    if (failed && !this.error) {
      this.error = failed;
      this.changed();
    }
  }

  dispose(): void {
    this.poller.dispose();
  }
}
