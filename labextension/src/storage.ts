/**
 * The Storage section's state and its "Add storage" form, generated from rclone's own
 * description of a backend (GET storage-backends/{backend}): secret options become
 * password fields, booleans checkboxes, exclusive choices selects.  Only the values the
 * user typed go into the request; the server checks them against the same schema and
 * names the option when one is wrong.
 */

import { CloudTikApi } from './model';
import { Observed, Refresher } from './poll';
import { Accepted, Operation } from './types';

export interface BackendOption {
  name: string;
  type: string;
  help: string;
  required: boolean;
  advanced: boolean;
  secret: boolean;
  default?: unknown;
  examples?: { Value: string; Help?: string; Provider?: string }[];
  exclusive?: boolean;
  providers?: string[] | null;
}

export interface BackendSchema {
  backend: string;
  description: string;
  providers: string[];
  options: BackendOption[];
}

export interface MountStatus {
  mode: string;
  desired: string;
  state: string;
  mount_path: string;
  reason: string | null;
  restarts: number;
  is_mountpoint?: boolean;
}

export interface StorageInfo {
  name: string;
  backend: string;
  options: Record<string, unknown>;
  secret_options: string[];
  source: string;
  read_only: boolean;
  mount_path: string;
  mount: MountStatus | null;
}

export interface ListingEntry {
  name: string;
  path: string;
  is_dir: boolean;
  size: number | null;
  mod_time: string | null;
}

export interface Listing {
  storage: string;
  path: string;
  entries: ListingEntry[];
  total: number;
  offset: number;
  limit: number;
  next_offset: number | null;
}

export type StorageFieldKind = 'text' | 'password' | 'boolean' | 'select' | 'number';

export interface StorageField {
  name: string;
  title: string;
  kind: StorageFieldKind;
  required: boolean;
  advanced: boolean;
  help: string;
  choices?: string[];
  placeholder?: string;
}

function firstLine(text: string): string {
  return (text || '').trim().split('\n')[0];
}

/** Form fields for a backend's options (the provider option is chosen separately). */
export function storageFields(schema: BackendSchema): StorageField[] {
  const out: StorageField[] = [];
  for (const o of schema.options) {
    if (o.name === 'provider' || o.name === 'description') {
      continue;
    }
    let kind: StorageFieldKind = 'text';
    let choices: string[] | undefined;
    if (o.secret) {
      kind = 'password';
    } else if (o.type === 'bool') {
      kind = 'boolean';
    } else if (o.exclusive && o.examples && o.examples.length) {
      kind = 'select';
      choices = ['', ...o.examples.map(e => e.Value)];
    } else if (o.type === 'int') {
      kind = 'number';
    }
    const def = o.default;
    out.push({
      name: o.name,
      title: o.name,
      kind,
      required: o.required,
      advanced: o.advanced,
      help: firstLine(o.help),
      choices,
      placeholder:
        def !== undefined && def !== null && def !== '' && typeof def !== 'object'
          ? String(def)
          : undefined
    });
  }
  return out;
}

export interface StorageRequest {
  name: string;
  backend: string;
  options: Record<string, unknown>;
  source?: string;
  read_only: boolean;
}

/** The body of POST storages for the form's values. */
export function buildStorageRequest(
  name: string,
  backend: string,
  provider: string,
  fields: StorageField[],
  values: Record<string, unknown>,
  source: string,
  readWrite: boolean
): StorageRequest {
  const options: Record<string, unknown> = {};
  if (provider) {
    options.provider = provider;
  }
  for (const f of fields) {
    const v = values[f.name];
    if (v === undefined || v === '' || (f.kind === 'boolean' && v === false)) {
      continue;
    }
    options[f.name] = f.kind === 'number' && String(v).trim() !== '' && Number.isFinite(Number(v))
      ? Number(v)
      : v;
  }
  const body: StorageRequest = { name: name.trim(), backend, options, read_only: !readWrite };
  if (source.trim()) {
    body.source = source.trim();
  }
  return body;
}

/** Does the server's error field (e.g. "options.endpoint") mean this form field? */
export function storageFieldMatches(field: string, serverField: string | null): boolean {
  return serverField === field || serverField === `options.${field}`;
}

/** The parent folder of a storage path ("" is the top). */
export function parentPath(path: string): string {
  const parts = path.split('/').filter(p => p);
  parts.pop();
  return parts.join('/');
}

/** Calls of the storage routes. */
export class StorageApi {
  constructor(readonly api: CloudTikApi) {}

  list(): Promise<{ storages: StorageInfo[] }> {
    return this.api.request('storages');
  }
  add(body: StorageRequest): Promise<StorageInfo> {
    return this.api.request('storages', { method: 'POST', body });
  }
  remove(name: string): Promise<unknown> {
    return this.api.request(`storages/${encodeURIComponent(name)}`, { method: 'DELETE' });
  }
  test(name: string): Promise<{ ok: boolean; entries?: number; error?: { message: string } }> {
    return this.api.request(`storages/${encodeURIComponent(name)}/test`, { method: 'POST' });
  }
  ls(name: string, path: string, offset = 0): Promise<Listing> {
    const q = `path=${encodeURIComponent(path)}&offset=${offset}&limit=100`;
    return this.api.request(`storages/${encodeURIComponent(name)}/ls?${q}`);
  }
  mount(name: string, mode = 'fuse'): Promise<StorageAccepted> {
    return this.api.request(`storages/${encodeURIComponent(name)}/mount`, {
      method: 'POST',
      body: { mode }
    });
  }
  unmount(name: string): Promise<StorageAccepted> {
    return this.api.request(`storages/${encodeURIComponent(name)}/mount`, { method: 'DELETE' });
  }
  backends(): Promise<{ backends: { name: string; description: string }[] }> {
    return this.api.request('storage-backends');
  }
  backend(name: string, provider = ''): Promise<BackendSchema> {
    const q = provider ? `?provider=${encodeURIComponent(provider)}` : '';
    return this.api.request(`storage-backends/${encodeURIComponent(name)}${q}`);
  }
}

export interface StorageAccepted {
  operation: Operation;
  storage: string | null;
}

export type { Accepted };

/**
 * The storages the section shows, like the clusters' and jobs' models: the list, the last
 * error, a change signal for the view, and one `Refresher` that polls every 10 s, every
 * second while a storage operation runs (`watch(true)`), and stands by when hidden.
 */
export class StorageModel extends Observed {
  readonly api: StorageApi;
  /** null until the first answer */
  storages: StorageInfo[] | null = null;
  /** the last error to show (the server's message), kept until dismissed */
  error: string | null = null;

  private readonly poller = new Refresher(() => this.refresh(), {
    seconds: 10,
    name: 'cloudtik:storage'
  });

  constructor(api: CloudTikApi) {
    super();
    this.api = new StorageApi(api);
  }

  async refresh(): Promise<void> {
    try {
      this.storages = (await this.api.list()).storages;
    } catch (e) {
      this.error = e instanceof Error ? e.message : String(e);
    }
    this.changed();
  }

  /** Poll while the section is open (faster while `busy`); returns what stops it. */
  watch(busy: boolean): () => void {
    this.poller.start(busy ? 1 : 10);
    return () => this.poller.stop();
  }

  setError(text: string | null): void {
    this.error = text;
    this.changed();
  }
}
