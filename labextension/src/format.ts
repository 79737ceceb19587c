/** How numbers and states look in the panel (same wording as the notebook tables). */

export function formatBytes(bytes: number | null | undefined): string {
  if (!bytes) {
    return '0 B';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = value >= 10 || unit === 0 ? 0 : 1;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

export function formatAge(seconds: number): string {
  if (seconds < 90) {
    return `${Math.max(0, Math.round(seconds))}s`;
  }
  if (seconds < 5400) {
    return `${Math.round(seconds / 60)}m`;
  }
  if (seconds < 48 * 3600) {
    return `${(seconds / 3600).toFixed(1)}h`;
  }
  return `${(seconds / 86400).toFixed(1)}d`;
}

export type BadgeKind = 'ok' | 'busy' | 'warn' | 'error' | 'off';

export function badgeKind(state: string): BadgeKind {
  switch (state) {
    case 'running':
      return 'ok';
    case 'starting':
    case 'scaling':
    case 'stopping':
      return 'busy';
    case 'degraded':
      return 'warn';
    case 'failed':
      return 'error';
    default:
      return 'off';
  }
}

/** The code "Insert client code" puts into the notebook. */
export function clientCode(name: string): string {
  return [
    'from jupyter_cloudtik import Cluster',
    '',
    `cluster = Cluster.get(${JSON.stringify(name)})`,
    'client = cluster.client()',
    'client'
  ].join('\n');
}
