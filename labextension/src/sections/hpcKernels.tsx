/** The HPC kernels section: every kernel of this server on a batch system, its job's queue
 *  state (and Slurm's reason), the node, the wall time left, why one died; open its
 *  notebook or shut it down (which ends the job). */

import * as React from 'react';

import { describeKernel } from '../hpcKernels';
import { canShutDown, HpcKernelsModel, ListedHpcKernel } from '../hpcKernelsModel';
import { jobBadge } from '../jobs';
import { useModel, useNow } from './hooks';
import { SectionProps } from './props';

/** Is the section there at all?  When the server offers HPC kernels or has some. */
export function useHpcKernelsVisible(props: SectionProps): boolean {
  useModel(props.hpcKernels);
  return props.hpcKernels.visible;
}

export function HpcKernelsSection(props: SectionProps): JSX.Element {
  const model = props.hpcKernels;
  useModel(model);
  const now = useNow(1);
  // poll while the section is open
  React.useEffect(() => model.watch(), [model]);
  const live = model.kernels.filter(canShutDown).length;
  return (
    <div className="jp-CloudTik-hpcKernels">
      <div className="jp-CloudTik-toolbar">
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-refreshHpcKernels"
          title="Refresh"
          onClick={() => void model.refresh()}
        >
          Refresh
        </button>
        <span className="jp-CloudTik-count">{live} running or waiting</span>
      </div>
      {model.error && (
        <div className="jp-CloudTik-error" role="alert">
          <span className="jp-CloudTik-errorText">{model.error}</span>
        </div>
      )}
      {model.loaded && model.kernels.length === 0 && !model.error && (
        <div className="jp-CloudTik-empty">
          No HPC kernels yet: choose one of the &ldquo;on &lt;backend&gt;&rdquo; kernels in the
          launcher, or &ldquo;HPC kernel…&rdquo; for a size of your own.
        </div>
      )}
      <ul className="jp-CloudTik-list jp-CloudTik-hpcKernelList">
        {model.kernels.map(k => (
          <KernelItem key={k.id} kernel={k} props={props} now={now} />
        ))}
      </ul>
    </div>
  );
}

function KernelItem(p: { kernel: ListedHpcKernel; props: SectionProps; now: number }) {
  const { kernel: k, props, now } = p;
  const model: HpcKernelsModel = props.hpcKernels;
  const busy = model.pending.has(k.id);
  const shutDown = async () => {
    const ok = await props.confirm(
      'Shut down the HPC kernel?',
      `Kernel ${k.id} (${k.profile} on ${k.backend})${k.job ? ` and its job ${k.job}` : ''} ` +
        'will be ended; its variables are lost.',
      'Shut down'
    );
    if (ok) {
      await model.shutdown(k.id);
    }
  };
  return (
    <li className="jp-CloudTik-hpcKernel" data-kernel-id={k.id} data-state={k.state}>
      <div className="jp-CloudTik-clusterHead">
        <span className="jp-CloudTik-name" title={`kernel ${k.id}`}>
          {k.profile} · {k.backend}
        </span>
        <span
          className={`jp-CloudTik-badge jp-mod-${jobBadge(k.state === 'dead' ? 'failed' : k.state)}`}
          data-state={k.state}
          title={k.native_state ?? k.state}
        >
          {k.orphaned ? 'ended' : k.state}
        </span>
      </div>
      <div className="jp-CloudTik-reason jp-CloudTik-hpcKernelLine">{describeKernel(k, now)}</div>
      {k.warning && (
        <div className="jp-CloudTik-reason jp-CloudTik-jobWarning" title="warning">
          warning: {k.warning}
        </div>
      )}
      {k.orphaned && (
        <div className="jp-CloudTik-reason" title="a server before this one started it">
          its server was stopped; this server ended the job
        </div>
      )}
      <div className="jp-CloudTik-actions">
        {k.notebook && (
          <button
            className="jp-Button jp-mod-styled jp-CloudTik-openKernelNotebook"
            title={k.notebook}
            onClick={() => void props.openPath(k.notebook!)}
          >
            Open notebook
          </button>
        )}
        {canShutDown(k) && (
          <button
            className="jp-Button jp-mod-styled jp-mod-warn jp-CloudTik-shutdownHpcKernel"
            disabled={busy}
            onClick={() => void shutDown()}
          >
            {busy ? 'Shutting down…' : 'Shut down'}
          </button>
        )}
      </div>
    </li>
  );
}
