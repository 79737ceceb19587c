/**
 * "HPC kernel of a custom size…": a form in the launcher for the profiles whose admin
 * lets users choose their kernel's size (HPCKernels.profiles[].custom).
 *
 * Why a form and not free spec names: the server decides (POST hpc/kernel-sizes checks
 * the admin's bounds, then the partition's limits, as every start does again) and names
 * the kernel spec; the page only asks.  A refusal comes back as the server's one line,
 * shown above the form with what the user typed kept.  The pure parts (which profiles,
 * the request, the bounds' wording) have no DOM, so the tests run them in Node.
 */

/** A kernel spec's `metadata.cloudtik` (hpc/kernels/specs.py, `spec_dict`). */
export interface HpcSpecMeta {
  backend: string;
  profile: string;
  cores: number;
  memory?: number | null;
  time: number;
  gpus?: number | null;
  partition?: string | null;
  custom?: CustomBounds | null;
  custom_size?: boolean;
  hub?: boolean; // a profile of the hub's catalogue (its sidekick checks the size)
}

/** What the admin lets users choose (null: only the partition bounds it). */
export interface CustomBounds {
  cores?: number | null;
  memory?: number | null;
  time?: number | null;
  gpus?: number | null;
}

export interface CustomProfile {
  spec: string; // the profile's own kernel spec
  backend: string;
  profile: string;
  title: string; // its display name
  defaults: HpcSpecMeta;
  bounds: CustomBounds;
}

/** What the form holds, as typed. */
export interface SizeValues {
  choice: string; // `${backend}/${profile}`
  cores: string;
  time: string; // minutes, or 90m, 2h, 1:30:00
  memory: string; // empty: the profile's
  gpus: string;
}

interface SpecModel {
  name: string;
  display_name: string;
  metadata?: Record<string, unknown>;
}

/** The profiles that offer custom sizes, from the server's kernel specs. */
export function customProfiles(
  specs: Record<string, SpecModel | undefined> | null | undefined
): CustomProfile[] {
  const out: CustomProfile[] = [];
  for (const [name, spec] of Object.entries(specs ?? {})) {
    const meta = spec?.metadata?.cloudtik as HpcSpecMeta | undefined;
    if (!meta || meta.custom_size || !meta.custom) {
      continue;
    }
    out.push({
      spec: name,
      backend: meta.backend,
      profile: meta.profile,
      title: spec!.display_name,
      defaults: meta,
      bounds: meta.custom
    });
  }
  out.sort((a, b) => a.title.localeCompare(b.title));
  return out;
}

export function choiceOf(p: CustomProfile): string {
  return `${p.defaults.hub ? 'hub:' : ''}${p.backend}/${p.profile}`;
}

/** The form's first values: the profile's own size. */
export function initialValues(p: CustomProfile): SizeValues {
  return {
    choice: choiceOf(p),
    cores: String(p.defaults.cores ?? 1),
    time: `${Math.round((p.defaults.time ?? 3600) / 60)}m`,
    memory: '',
    gpus: p.defaults.gpus ? String(p.defaults.gpus) : ''
  };
}

export function formatBytes(n: number): string {
  const gib = n / 2 ** 30;
  if (gib >= 1 && Number.isInteger(gib)) {
    return `${gib} GiB`;
  }
  return `${Math.round(n / 2 ** 20)} MiB`;
}

export function formatMinutes(seconds: number): string {
  const minutes = Math.round(seconds / 60);
  if (minutes % 60 === 0) {
    return `${minutes / 60} h`;
  }
  return minutes > 60 ? `${Math.floor(minutes / 60)} h ${minutes % 60} min` : `${minutes} min`;
}

/** "at most 8 cores, 4 h, 16 GiB, no GPU": what the admin allows, for the form. */
export function describeBounds(p: CustomProfile): string {
  const b = p.bounds;
  const parts: string[] = [];
  parts.push(b.cores ? `at most ${b.cores} core${b.cores === 1 ? '' : 's'}` : 'any core count');
  parts.push(b.time ? `${formatMinutes(b.time)} of wall time` : 'any wall time');
  if (b.memory) {
    parts.push(`${formatBytes(b.memory)} of memory`);
  }
  const gpus = b.gpus ?? p.defaults.gpus ?? 0;
  parts.push(gpus ? `${gpus} GPU${gpus === 1 ? '' : 's'}` : 'no GPU');
  return `${parts.join(', ')} (and what the partition has)`;
}

/** The body of POST hpc/kernel-sizes, or the field a person must fix (as the server
 *  would say it).  Sizes are checked by the server; here only what is not a number. */
export function sizeRequest(
  profiles: CustomProfile[],
  v: SizeValues
): { body: Record<string, unknown> } | { error: string } {
  const p = profiles.find(x => choiceOf(x) === v.choice);
  if (!p) {
    return { error: `profile: choose one of ${profiles.map(choiceOf).join(', ') || 'none'}` };
  }
  const cores = Number(v.cores.trim());
  if (!/^\d+$/.test(v.cores.trim()) || cores < 1) {
    return { error: `cores: '${v.cores}' is not a core count; use 1 or more` };
  }
  const time = v.time.trim();
  if (!time) {
    return { error: 'time: give the wall time (e.g. 90m or 2h)' };
  }
  const body: Record<string, unknown> = {
    backend: p.backend,
    profile: p.profile,
    ...(p.defaults.hub ? { hub: true } : {}),
    cores,
    // a bare number is minutes, as Slurm and the server read it
    time: /^\d+$/.test(time) ? `${time}m` : time
  };
  if (v.memory.trim()) {
    body.memory = v.memory.trim();
  }
  const gpus = v.gpus.trim();
  if (gpus) {
    if (!/^\d+$/.test(gpus)) {
      return { error: `gpus: '${v.gpus}' is not a GPU count` };
    }
    body.gpus = Number(gpus);
  }
  return { body };
}
