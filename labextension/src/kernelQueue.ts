/**
 * An HPC kernel's batch job in its notebook's toolbar, beside the kernel's name.
 *
 * Why: while the kernel's job waits in the batch queue (minutes, hours), JupyterLab can
 * only show the kernel as "starting"; the user needs to see that it is queued and why
 * (Slurm's reason), then where it runs and how much wall time is left, and why it died.
 * The server keeps that in memory (`GET hpc/kernels`, no backend call).  Before the kernel
 * has an id the page knows, its entry is found by the notebook it was started for
 * (`session`: jupyter_server's JPY_SESSION_NAME, the file's path on the server).
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import {
  describeKernel,
  FAST_SECONDS,
  isHpcKernelName,
  HpcKernel,
  kernelFor,
  shortKernel,
  SLOW_SECONDS
} from './hpcKernels';
import { CloudTikApi } from './model';

/** The toolbar item of one notebook. */
export class HpcKernelStatus extends Widget {
  private timer: number | undefined;
  private disposedFlag = false;
  private readonly changed_ = new Signal<this, void>(this);

  /** Emitted whenever what it shows changes (the status bar mirrors it). */
  get changed(): ISignal<this, void> {
    return this.changed_;
  }

  constructor(
    private readonly api: CloudTikApi,
    private readonly panel: NotebookPanel
  ) {
    super();
    this.addClass('jp-CloudTikHpcKernel');
    this.node.setAttribute('data-state', 'none');
    this.hide();
    panel.sessionContext.statusChanged.connect(this.lookSoon, this);
    panel.sessionContext.kernelChanged.connect(this.lookSoon, this);
    this.lookSoon();
  }

  private kernelName(): string {
    const ctx = this.panel.sessionContext;
    return ctx.session?.kernel?.name ?? ctx.kernelPreference.name ?? '';
  }

  private lookSoon(): void {
    this.schedule(0.2);
  }

  private schedule(seconds: number): void {
    if (this.disposedFlag) {
      return;
    }
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.look(), seconds * 1000);
  }

  private async look(): Promise<void> {
    let shown: HpcKernel | null = null;
    if (!document.hidden) {
      try {
        const answer = await this.api.request<{ kernels: HpcKernel[] }>('hpc/kernels');
        const kernelId = this.panel.sessionContext.session?.kernel?.id;
        shown = kernelFor(answer.kernels ?? [], this.panel.context.path, kernelId);
      } catch {
        shown = null; // the server is away: the kernel's own status says so
      }
      this.show_(shown);
    }
    const involved = shown !== null || isHpcKernelName(this.kernelName());
    this.schedule(involved ? FAST_SECONDS : SLOW_SECONDS);
  }

  private show_(k: HpcKernel | null): void {
    if (k === null) {
      this.node.textContent = '';
      this.node.setAttribute('data-state', 'none');
      this.hide();
      this.changed_.emit();
      return;
    }
    const now = Date.now() / 1000;
    const line = describeKernel(k, now);
    this.node.textContent = shortKernel(k, now);
    this.node.title =
      `HPC kernel ${k.id} (profile ${k.profile} of ${k.backend}): ${line}` +
      (k.warning ? ` (${k.warning})` : '');
    this.node.setAttribute('data-warning', k.warning ? 'yes' : 'no');
    this.node.setAttribute('data-state', k.state);
    this.show();
    this.changed_.emit();
  }

  dispose(): void {
    this.disposedFlag = true;
    window.clearTimeout(this.timer);
    super.dispose();
  }
}

/** Put the item into a notebook's toolbar, just before the kernel's name where it has
 *  one (a toolbar short of room hides its last items under "more" first). */
export function addHpcKernelStatus(api: CloudTikApi, panel: NotebookPanel): void {
  const item = new HpcKernelStatus(api, panel);
  if (!panel.toolbar.insertBefore('kernelName', 'cloudtikHpcKernel', item)) {
    panel.toolbar.addItem('cloudtikHpcKernel', item);
  }
  ITEMS.set(panel, item);
  ADDED.emit(panel); // the tracker may have made it current before this ran
  panel.disposed.connect(() => item.dispose());
}

const ITEMS = new WeakMap<NotebookPanel, HpcKernelStatus>();
const ADDED = new Signal<unknown, NotebookPanel>({});

/**
 * The same line in JupyterLab's status bar, beside the kernel's own status ("Python 3 on
 * daint — 1 core | Starting"), for the notebook in front: where people look for what
 * their kernel is doing.  It mirrors that notebook's toolbar item (one poll per notebook).
 */
export class HpcKernelStatusBarItem extends Widget {
  private source: HpcKernelStatus | null = null;

  constructor(private readonly tracker: INotebookTracker) {
    super();
    this.addClass('jp-CloudTikHpcKernelStatus');
    this.node.setAttribute('data-state', 'none');
    tracker.currentChanged.connect(this.follow, this);
    ADDED.connect(this.follow, this);
    this.follow();
  }

  private follow(): void {
    this.source?.changed.disconnect(this.mirror, this);
    const panel = this.tracker.currentWidget;
    this.source = panel ? ITEMS.get(panel) ?? null : null;
    this.source?.changed.connect(this.mirror, this);
    this.mirror();
  }

  private mirror(): void {
    const src = this.source;
    const state = src?.node.getAttribute('data-state') ?? 'none';
    this.node.textContent = state === 'none' ? '' : src!.node.textContent;
    this.node.title = state === 'none' ? '' : src!.node.title;
    this.node.setAttribute('data-state', state);
    this.node.setAttribute('data-warning', src?.node.getAttribute('data-warning') ?? 'no');
  }
}
