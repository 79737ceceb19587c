/**
 * The "New cluster" form, generated from a provider's JSON Schema.
 *
 * Common fields (name, workers, worker size, idle timeout) come first, then the
 * provider's own settings from its `config_schema`.  Only values that differ from the
 * defaults go into the request, so a cluster started here has the same config (and is
 * "the same cluster") as `%cluster up --name N --workers W` in a notebook.
 */

import { JSONSchema, ProviderInfo } from './types';

export type FieldKind = 'string' | 'integer' | 'number' | 'boolean' | 'enum';

export interface FieldSpec {
  key: string;
  title: string;
  kind: FieldKind;
  section: 'cluster' | 'provider';
  options?: string[];
  default?: unknown;
  description?: string;
  minimum?: number;
  maximum?: number;
  placeholder?: string;
}

export type FormValues = Record<string, unknown>;

function kindOf(schema: JSONSchema): FieldKind | null {
  if (Array.isArray(schema.enum)) {
    return 'enum';
  }
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  for (const t of types) {
    if (t === 'string' || t === 'integer' || t === 'number' || t === 'boolean') {
      return t;
    }
  }
  return null;
}

/** Fields for the provider's own settings (`type` is implied; nested objects are skipped). */
export function providerFields(schema: JSONSchema | undefined): FieldSpec[] {
  const out: FieldSpec[] = [];
  for (const [key, prop] of Object.entries(schema?.properties ?? {})) {
    if (key === 'type' || prop.const !== undefined) {
      continue;
    }
    const kind = kindOf(prop);
    if (kind === null) {
      continue;
    }
    out.push({
      key: `provider.${key}`,
      title: prop.title ?? key,
      kind,
      section: 'provider',
      options: kind === 'enum' ? (prop.enum ?? []).map(String) : undefined,
      default: prop.default,
      description: prop.description,
      minimum: prop.minimum,
      maximum: prop.maximum
    });
  }
  return out;
}

/** The worker node type of a provider's defaults: the one that is not the head. */
export function workerType(provider: ProviderInfo): [string, any] | null {
  const types = provider.default_node_types ?? {};
  const name = Object.keys(types).find(t => t !== 'head');
  return name ? [name, types[name]] : null;
}

/** Is this choice a hub catalogue entry (whose provider settings the admin fixed)? */
export function isCatalogEntry(provider: ProviderInfo): boolean {
  return typeof provider.kind === 'string' && provider.kind !== '';
}

/** The default runtime of a cluster config without `runtime:` (as on the server). */
export const DEFAULT_RUNTIME = 'dask';

/** The Runtime field's choices: each installed runtime, then all of them on the same
 * nodes (`dask,spark`). */
export function runtimeChoices(runtimes: string[]): string[] {
  return runtimes.length > 1 ? [...runtimes, runtimes.join(',')] : [...runtimes];
}

/** `base`, or `base-2`, `base-3`, ... : the first name no listed cluster has (the New
 * form must not offer a name whose `up` would be refused as a clash). */
export function freeName(base: string, taken: string[]): string {
  const used = new Set(taken);
  if (!used.has(base)) {
    return base;
  }
  let n = 2;
  while (used.has(`${base}-${n}`)) {
    n += 1;
  }
  return `${base}-${n}`;
}

export function clusterFields(
  provider: ProviderInfo,
  defaultWorkers: number,
  runtimes: string[] = [],
  takenNames: string[] = []
): FieldSpec[] {
  const worker = workerType(provider);
  const maxWorkers = worker ? Number(worker[1].max_workers ?? 10000) : 10000;
  const fields: FieldSpec[] = [
    {
      key: 'name',
      title: 'Name',
      kind: 'string',
      section: 'cluster',
      default: freeName('default', takenNames),
      description: "lower-case letters, digits and '-'"
    },
    {
      key: 'workers',
      title: 'Workers',
      kind: 'integer',
      section: 'cluster',
      default: Math.min(defaultWorkers, maxWorkers),
      minimum: 0
    }
  ];
  if (runtimes.length > 1) {
    fields.push({
      key: 'runtime',
      title: 'Runtime',
      kind: 'enum',
      section: 'cluster',
      options: runtimeChoices(runtimes),
      default: runtimes.includes(DEFAULT_RUNTIME) ? DEFAULT_RUNTIME : runtimes[0],
      description: 'what the nodes run (runtime.types); several run side by side'
    });
  }
  if (worker) {
    fields.push(
      {
        key: 'worker.CPU',
        title: 'Cores per worker',
        kind: 'integer',
        section: 'cluster',
        // unset (the local provider): threads are a share of the machine, as LocalCluster
        // gives them, and only a value typed here is sent
        default: worker[1].resources?.CPU,
        // short enough to be read whole in the panel's width; the tooltip says more
        placeholder: worker[1].resources?.CPU === undefined ? 'empty: provider default' : undefined,
        description:
          "threads of each worker (resources.CPU); empty: the provider's default, which is " +
          'a share of the machine (cores / workers) on the local provider and the ' +
          "flavor's cores on a cloud",
        minimum: 1
      },
      {
        key: 'worker.memory',
        title: 'Memory per worker',
        kind: 'string',
        section: 'cluster',
        default: '',
        placeholder: 'e.g. 2GiB; empty: default',
        description:
          "memory limit of each worker (resources.memory), e.g. 2GiB; empty: the provider's " +
          "default, which is the worker's share of the machine's memory on the local provider"
      }
    );
  }
  fields.push({
    key: 'idle_timeout_minutes',
    title: 'Shut down when idle (minutes, 0 = never)',
    kind: 'number',
    section: 'cluster',
    default: 0,
    minimum: 0
  });
  // a hub catalogue entry brings its admin's settings: the sidekick ignores ours
  if (isCatalogEntry(provider)) {
    return fields;
  }
  return [...fields, ...providerFields(provider.config_schema)];
}

export function initialValues(fields: FieldSpec[]): FormValues {
  const values: FormValues = {};
  for (const f of fields) {
    values[f.key] = f.default ?? (f.kind === 'boolean' ? false : '');
  }
  return values;
}

/** Turn a text input into the JSON value the server expects (bad numbers stay text, so
 * the server's message names the field). */
export function coerce(field: FieldSpec, raw: unknown): unknown {
  if (raw === '' || raw === null || raw === undefined) {
    return undefined;
  }
  if ((field.kind === 'integer' || field.kind === 'number') && typeof raw === 'string') {
    const n = Number(raw.trim());
    if (raw.trim() !== '' && Number.isFinite(n)) {
      return n;
    }
    return raw;
  }
  return raw;
}

export interface CreateRequest {
  name?: string;
  workers?: unknown;
  config: Record<string, any>;
}

/** The body of POST clusters for these form values. */
export function buildCreateRequest(
  provider: ProviderInfo,
  fields: FieldSpec[],
  values: FormValues
): CreateRequest {
  const byKey = new Map(fields.map(f => [f.key, f]));
  const get = (key: string) => {
    const f = byKey.get(key);
    return f ? coerce(f, values[key]) : undefined;
  };
  const providerSection: Record<string, unknown> = { type: provider.name };
  for (const f of fields) {
    if (f.section !== 'provider') {
      continue;
    }
    const v = coerce(f, values[f.key]);
    if (v !== undefined && v !== f.default) {
      providerSection[f.key.slice('provider.'.length)] = v;
    }
  }
  const config: Record<string, any> = { provider: providerSection };
  const idle = get('idle_timeout_minutes');
  if (idle !== undefined && idle !== 0) {
    config.idle_timeout_minutes = idle;
  }
  const runtime = get('runtime');
  if (runtime !== undefined && runtime !== DEFAULT_RUNTIME) {
    config.runtime = { types: String(runtime).split(',') };
  }
  const worker = workerType(provider);
  const cpu = get('worker.CPU');
  const memory = get('worker.memory');
  if (worker && ((cpu !== undefined && cpu !== byKey.get('worker.CPU')?.default) || memory)) {
    const types = JSON.parse(JSON.stringify(provider.default_node_types ?? {}));
    const resources = { ...(types[worker[0]].resources ?? {}) };
    if (cpu !== undefined) {
      resources.CPU = cpu;
    }
    if (memory) {
      resources.memory = memory;
    }
    types[worker[0]].resources = resources;
    config.available_node_types = types;
    config.head_node_type = 'head';
  }
  const request: CreateRequest = { config };
  const name = get('name');
  if (name !== undefined) {
    request.name = String(name).trim();
  }
  const workers = get('workers');
  if (workers !== undefined) {
    request.workers = workers;
  }
  return request;
}

/** Does the server's error `field` (e.g. cluster_name, provider.host) mean this form field? */
export function fieldMatches(field: FieldSpec, serverField: string): boolean {
  switch (field.key) {
    case 'name':
      return serverField === 'cluster_name' || serverField === 'name';
    case 'workers':
      return (
        serverField === 'workers' ||
        serverField === 'max_workers' ||
        serverField.endsWith('min_workers')
      );
    case 'worker.CPU':
      return serverField.endsWith('resources.CPU');
    case 'worker.memory':
      return serverField.endsWith('resources.memory');
    case 'runtime':
      return serverField.startsWith('runtime');
  }
  return serverField === field.key || serverField.endsWith(`.${field.key}`);
}
