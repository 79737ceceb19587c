/**
 * What the notebook's toolbar says about an HPC kernel's batch job (kernelQueue.ts shows
 * it): which of the server's HPC kernels (`GET hpc/kernels`) is the notebook's, and one
 * line in the server log's words.  No DOM here, so the tests run it in Node.
 */

export interface HpcKernel {
  id: string;
  backend: string;
  profile: string;
  state: 'submitting' | 'queued' | 'running' | 'dead' | string;
  job?: string | null;
  native_state?: string | null;
  reason?: string | null;
  node?: string | null;
  deadline?: number;
  warning?: string;
  session?: string | null;
  orphaned?: boolean;
  time?: number;
}

/** The kernel spec names of HPC kernels (hpc/kernels/profiles.py, `spec_name`): the
 *  server's own profiles, and the hub's (`cloudtik-hub-`, submitted by its sidekick). */
export const HPC_KERNEL_PREFIX = 'cloudtik-hpc-';
export const HUB_KERNEL_PREFIX = 'cloudtik-hub-';

export function isHpcKernelName(name: string): boolean {
  return name.startsWith(HPC_KERNEL_PREFIX) || name.startsWith(HUB_KERNEL_PREFIX);
}

/** Seconds between two looks while an HPC kernel is involved, and otherwise. */
export const FAST_SECONDS = 2;
export const SLOW_SECONDS = 20;

/** The notebook's kernel: by id once it has one, else the newest one being started for
 *  the notebook at `path` (an API path, relative to the server's root). */
export function kernelFor(
  kernels: HpcKernel[],
  path: string,
  kernelId: string | null | undefined
): HpcKernel | null {
  if (kernelId) {
    const byId = kernels.find(k => k.id === kernelId);
    if (byId) {
      return byId;
    }
  }
  const forPath = (session: string | null | undefined) =>
    !!session && !!path && (session === path || session.endsWith('/' + path));
  const starting = kernels.filter(
    k =>
      !k.orphaned &&
      forPath(k.session) &&
      (k.state === 'submitting' || k.state === 'queued' || (!kernelId && k.state === 'dead'))
  );
  starting.sort((a, b) => (b.time ?? 0) - (a.time ?? 0));
  return starting[0] ?? null;
}

export function formatLeft(seconds: number): string {
  if (seconds <= 0) {
    return 'no wall time left';
  }
  const minutes = Math.floor(seconds / 60);
  if (minutes < 1) {
    return `${Math.round(seconds)} s left`;
  }
  if (minutes < 60) {
    return `${minutes} min left`;
  }
  const rest = minutes % 60;
  return `${Math.floor(minutes / 60)} h${rest ? ` ${rest} min` : ''} left`;
}

/** One line for the toolbar, in the server log's words. */
export function describeKernel(k: HpcKernel, nowSeconds: number): string {
  const job = k.job ? `job ${k.job}` : "the kernel's job";
  switch (k.state) {
    case 'submitting':
      return `${k.backend}: submitting the kernel's job`;
    case 'queued':
      return `${k.backend}: ${job} queued${k.reason ? ` (${k.reason})` : ''}`;
    case 'running': {
      const where = k.node ? ` on ${k.node}` : ' running';
      const left = k.deadline ? ` · ${formatLeft(k.deadline - nowSeconds)}` : '';
      return `${k.backend}: ${job}${where}${left}`;
    }
    case 'dead':
      return `${k.backend}: ${job} ended${k.reason ? `: ${k.reason}` : ''}`;
    default:
      return `${k.backend}: ${job} ${k.state}`;
  }
}

/** The few words the toolbar has room for (the whole line is its tooltip). */
export function shortKernel(k: HpcKernel, nowSeconds: number): string {
  switch (k.state) {
    case 'submitting':
      return `${k.backend}: submitting`;
    case 'queued':
      return `${k.backend}: queued${k.reason ? ` (${k.reason})` : ''}`;
    case 'running':
      return k.deadline
        ? `${k.backend}: ${formatLeft(k.deadline - nowSeconds)}`
        : `${k.backend}: running`;
    case 'dead':
      return `${k.backend}: ended`;
    default:
      return `${k.backend}: ${k.state}`;
  }
}
