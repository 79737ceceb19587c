/**
 * The form `%storage add NAME URL --ask KEY` shows in a notebook cell (MIME type
 * `application/vnd.cloudtik.storage-add+json`, rendered by mime.ts).
 *
 * The kernel may not add storages (its token is refused: credentials go from the browser
 * to the server, never through the kernel), so it sends what it asked for — the request
 * without the asked values, already checked by the server (`POST storage-checks`) — and
 * the user types the asked values here.  Add posts the request with those values from
 * the browser (`POST storages`, the user's own session).  The kernel waits for the
 * storage to appear and then replaces this output with its one-line result.
 */

/** The body fields of `POST storages` (openapi.yaml's StorageCreate) the form sends. */
const REQUEST_FIELDS = [
  'name',
  'backend',
  'url',
  'source',
  'read_only',
  'mount_path',
  'vfs_cache_mode',
  'description',
  'replace'
] as const;

export interface StorageAddData {
  version: 1;
  /** POST storages' body without the asked values */
  request: Record<string, unknown> & { name: string; options: Record<string, unknown> };
  /** the options whose values the user types here */
  ask: string[];
  /** those of `ask` that rclone marks secret */
  secret: string[];
  /** what the server's check says will be recorded */
  storage: {
    backend: string;
    source: string;
    access: string;
    mount_path: string;
    options: Record<string, unknown>;
  };
  /** seconds the kernel waits */
  timeout: number;
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

const isStringList = (v: unknown): v is string[] =>
  Array.isArray(v) && v.every(s => typeof s === 'string' && s.length > 0);

/** The output's data if it is a storage form this extension understands, else null. */
export function readStorageAdd(data: unknown): StorageAddData | null {
  if (!isObject(data) || data.version !== 1) {
    return null;
  }
  const { request, ask, storage } = data;
  if (!isObject(request) || typeof request.name !== 'string' || !request.name) {
    return null;
  }
  if (request.options !== undefined && request.options !== null && !isObject(request.options)) {
    return null;
  }
  if (!isStringList(ask) || !isObject(storage)) {
    return null;
  }
  const secret = isStringList(data.secret) ? data.secret : [];
  const text = (v: unknown) => (typeof v === 'string' ? v : '');
  return {
    version: 1,
    request: { ...request, name: request.name, options: { ...((request.options as object) ?? {}) } },
    ask: Array.from(new Set(ask)),
    secret: secret.filter(k => ask.includes(k)),
    storage: {
      backend: text(storage.backend),
      source: text(storage.source),
      access: text(storage.access),
      mount_path: text(storage.mount_path),
      options: isObject(storage.options) ? storage.options : {}
    },
    timeout: typeof data.timeout === 'number' ? data.timeout : 0
  };
}

/** The rows the form shows: where the values will go (check them before typing). */
export function summaryRows(data: StorageAddData): [string, string][] {
  const s = data.storage;
  const rows: [string, string][] = [
    ['backend', s.backend],
    ['source', s.source || '/'],
    ['access', s.access],
    ['mount path', s.mount_path]
  ];
  for (const [key, value] of Object.entries(s.options)) {
    if (!data.ask.includes(key)) {
      rows.push([`option ${key}`, typeof value === 'string' ? value : JSON.stringify(value)]);
    }
  }
  if (data.request.replace === true) {
    rows.push(['replace', `yes: storage ${data.request.name} is replaced`]);
  }
  return rows;
}

/** What is wrong with the typed values (the first asked key left empty), or null. */
export function missingValue(data: StorageAddData, values: Record<string, string>): string | null {
  for (const key of data.ask) {
    if (!values[key]) {
      return key;
    }
  }
  return null;
}

/** The body of POST storages: the kernel's request and the values typed here. */
export function buildAddBody(
  data: StorageAddData,
  values: Record<string, string>
): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  for (const field of REQUEST_FIELDS) {
    const v = data.request[field];
    if (v !== undefined && v !== null) {
      body[field] = v;
    }
  }
  const options: Record<string, unknown> = { ...data.request.options };
  for (const key of data.ask) {
    options[key] = values[key] ?? '';
  }
  body.options = options;
  return body;
}

/** Does the server's error field ("options.secret_access_key") name this asked key? */
export function askedFieldMatches(key: string, serverField: string | null): boolean {
  return serverField === `options.${key}`;
}
