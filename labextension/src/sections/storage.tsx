/** The Storage section: storages with their mounts, Add form, Test, Mount/Unmount, Browse. */

import * as React from 'react';

import { formatBytes } from '../format';
import { ApiError } from '../model';
import { FINAL_STEPS, OperationRow } from '../operations';
import {
  BackendSchema,
  buildStorageRequest,
  Listing,
  parentPath,
  StorageApi,
  StorageField,
  storageFieldMatches,
  storageFields,
  StorageInfo,
  StorageModel
} from '../storage';
import { useModel } from './hooks';
import { SectionProps } from './props';

function storageRows(props: SectionProps): OperationRow[] {
  const now = Date.now() / 1000;
  return props.clusters.ops.visible(now).filter(r => r.kind.startsWith('storage.'));
}

export function StorageSection(props: SectionProps): JSX.Element {
  const model = React.useMemo(() => new StorageModel(props.clusters.api), [props.clusters.api]);
  const api = model.api;
  useModel(model);
  const { storages, error } = model;
  const setError = (text: string | null) => model.setError(text);
  const [adding, setAdding] = React.useState(false);
  const version = useModel(props.clusters);
  const rows = storageRows(props);
  const active = rows.filter(r => !FINAL_STEPS.includes(r.state)).length;

  const refresh = React.useCallback(() => model.refresh(), [model]);

  React.useEffect(() => {
    void refresh();
  }, [refresh, active, version > 0 && active === 0]);
  React.useEffect(() => model.watch(active > 0), [model, active]);

  const fail = (e: unknown) => setError(e instanceof Error ? e.message : String(e));
  const track = (op: any) => {
    props.clusters.ops.addOperation(op);
    void refresh();
  };

  return (
    <div className="jp-CloudTik-storage">
      <div className="jp-CloudTik-toolbar">
        <button
          className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-addStorage"
          onClick={() => setAdding(!adding)}
        >
          Add
        </button>
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-storageRefresh"
          onClick={() => void refresh()}
        >
          Refresh
        </button>
      </div>
      {error && (
        <div className="jp-CloudTik-error jp-CloudTik-storageError" role="alert">
          <span className="jp-CloudTik-errorText">{error}</span>
          <button className="jp-CloudTik-dismiss" onClick={() => setError(null)}>
            ×
          </button>
        </div>
      )}
      {adding && (
        <AddStorageForm
          api={api}
          onDone={() => {
            setAdding(false);
            void refresh();
          }}
        />
      )}
      {rows.length > 0 && (
        <div className="jp-CloudTik-ops">
          {rows.map(row => (
            <div
              key={row.id}
              className={`jp-CloudTik-op jp-mod-${row.state}`}
              data-op-id={row.id}
              data-state={row.state}
            >
              <div className="jp-CloudTik-opTitle">
                <span>
                  {row.kind.replace('storage.', '')} <b>{row.cluster.replace('/mount', '')}</b>
                </span>
              </div>
              <progress max={1} value={row.state === 'succeeded' ? 1 : row.fraction} />
              <div className="jp-CloudTik-opStep">
                {row.state === 'failed' && row.error ? row.error : `${row.step}: ${row.message}`}
              </div>
            </div>
          ))}
        </div>
      )}
      {storages !== null && storages.length === 0 && (
        <div className="jp-CloudTik-empty">
          No storages. Add one with <b>Add</b>, or <code>%storage add</code> in a notebook.
        </div>
      )}
      <ul className="jp-CloudTik-list">
        {(storages ?? []).map(s => (
          <StorageItem
            key={s.name}
            storage={s}
            api={api}
            busy={rows.some(
              r => !FINAL_STEPS.includes(r.state) && r.cluster.replace('/mount', '') === s.name
            )}
            onError={fail}
            onOperation={track}
            onChanged={() => void refresh()}
            confirm={props.confirm}
          />
        ))}
      </ul>
    </div>
  );
}

function mountLabel(s: StorageInfo): string {
  if (!s.mount) {
    return 'not mounted';
  }
  return s.mount.mode === 'sync' ? `${s.mount.state} (copy)` : s.mount.state;
}

function StorageItem(props: {
  storage: StorageInfo;
  api: StorageApi;
  busy: boolean;
  onError: (e: unknown) => void;
  onOperation: (op: any) => void;
  onChanged: () => void;
  confirm: SectionProps['confirm'];
}): JSX.Element {
  const s = props.storage;
  const [browsing, setBrowsing] = React.useState(false);
  const [testResult, setTestResult] = React.useState<string | null>(null);
  const mounted = s.mount !== null && s.mount.desired === 'mounted';

  const run = async (call: () => Promise<any>) => {
    try {
      const accepted = await call();
      props.onOperation(accepted.operation);
    } catch (e) {
      props.onError(e);
    }
  };
  const test = async () => {
    setTestResult('testing…');
    try {
      const r = await props.api.test(s.name);
      setTestResult(r.ok ? `ok: ${r.entries} entries` : `failed: ${r.error?.message ?? ''}`);
    } catch (e) {
      setTestResult(null);
      props.onError(e);
    }
  };
  const remove = async () => {
    const ok = await props.confirm(
      `Remove storage ${s.name}?`,
      `'${s.name}' is unmounted and forgotten with its credentials; the data stays where it is.`,
      'Remove'
    );
    if (!ok) {
      return;
    }
    try {
      await props.api.remove(s.name);
      props.onChanged();
    } catch (e) {
      props.onError(e);
    }
  };

  return (
    <li className="jp-CloudTik-storageItem" data-name={s.name} data-mount={s.mount?.state ?? ''}>
      <div className="jp-CloudTik-clusterHead">
        <span className="jp-CloudTik-name">{s.name}</span>
        <span
          className={`jp-CloudTik-badge jp-mod-${s.mount?.state === 'mounted' || s.mount?.state === 'synced' ? 'ok' : s.mount?.state === 'failed' ? 'error' : 'idle'}`}
          title={s.mount?.reason ?? mountLabel(s)}
        >
          {mountLabel(s)}
        </span>
      </div>
      <div className="jp-CloudTik-facts">
        <span title="rclone backend">{s.backend}</span>
        <span title="source">{s.source || '/'}</span>
        <span title="access" className="jp-CloudTik-access">
          {s.read_only ? 'read-only' : 'read-write'}
        </span>
        {mounted && <span title="mount path">{s.mount?.mount_path}</span>}
      </div>
      {s.mount?.reason && <div className="jp-CloudTik-reason">{s.mount.reason}</div>}
      {testResult && <div className="jp-CloudTik-testResult">{testResult}</div>}
      <div className="jp-CloudTik-actions">
        <button className="jp-Button jp-mod-styled jp-CloudTik-browse" onClick={() => setBrowsing(!browsing)}>
          Browse
        </button>
        <button className="jp-Button jp-mod-styled jp-CloudTik-test" onClick={() => void test()}>
          Test
        </button>
        {mounted ? (
          <button
            className="jp-Button jp-mod-styled jp-CloudTik-unmount"
            disabled={props.busy}
            onClick={() => void run(() => props.api.unmount(s.name))}
          >
            Unmount
          </button>
        ) : (
          <button
            className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-mount"
            disabled={props.busy}
            onClick={() => void run(() => props.api.mount(s.name))}
          >
            Mount
          </button>
        )}
        <button
          className="jp-Button jp-mod-styled jp-mod-warn jp-CloudTik-remove"
          disabled={props.busy}
          onClick={() => void remove()}
        >
          Remove
        </button>
      </div>
      {browsing && <Browser api={props.api} name={s.name} onError={props.onError} />}
    </li>
  );
}

function Browser(props: { api: StorageApi; name: string; onError: (e: unknown) => void }) {
  const [path, setPath] = React.useState('');
  const [listing, setListing] = React.useState<Listing | null>(null);
  const [loading, setLoading] = React.useState(false);

  const load = React.useCallback(
    async (p: string, offset = 0) => {
      setLoading(true);
      try {
        const page = await props.api.ls(props.name, p, offset);
        setListing(prev =>
          offset > 0 && prev ? { ...page, entries: [...prev.entries, ...page.entries] } : page
        );
        setPath(p);
      } catch (e) {
        props.onError(e);
      } finally {
        setLoading(false);
      }
    },
    [props.api, props.name]
  );
  React.useEffect(() => {
    void load('');
  }, [load]);

  return (
    <div className="jp-CloudTik-browser" data-path={path}>
      <div className="jp-CloudTik-browserPath">
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-up"
          disabled={!path || loading}
          onClick={() => void load(parentPath(path))}
        >
          ↑
        </button>
        <code>
          {props.name}:{path}
        </code>
        {listing && <span className="jp-CloudTik-browserTotal"> ({listing.total} entries)</span>}
      </div>
      <ul className="jp-CloudTik-entries">
        {(listing?.entries ?? []).map(e => (
          <li key={e.path} className="jp-CloudTik-entry" data-dir={e.is_dir ? '1' : '0'}>
            {e.is_dir ? (
              <a href="#" onClick={ev => { ev.preventDefault(); void load(e.path); }}>
                📁 {e.name}
              </a>
            ) : (
              <span>
                {e.name} <small>{formatBytes(e.size)}</small>
              </span>
            )}
          </li>
        ))}
      </ul>
      {listing && listing.next_offset !== null && (
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-more"
          onClick={() => void load(path, listing.next_offset ?? 0)}
        >
          More
        </button>
      )}
    </div>
  );
}

function AddStorageForm(props: { api: StorageApi; onDone: () => void }): JSX.Element {
  const [backends, setBackends] = React.useState<{ name: string; description: string }[]>([]);
  const [backend, setBackend] = React.useState('s3');
  const [provider, setProvider] = React.useState('');
  const [schema, setSchema] = React.useState<BackendSchema | null>(null);
  const [values, setValues] = React.useState<Record<string, unknown>>({});
  const [name, setName] = React.useState('');
  const [source, setSource] = React.useState('');
  const [readWrite, setReadWrite] = React.useState(false);
  const [advanced, setAdvanced] = React.useState(false);
  const [problem, setProblem] = React.useState<ApiError | null>(null);
  const [busy, setBusy] = React.useState(false);

  React.useEffect(() => {
    props.api
      .backends()
      .then(r => setBackends(r.backends))
      .catch(e => setProblem(e));
  }, [props.api]);
  React.useEffect(() => {
    props.api
      .backend(backend, provider)
      .then(s => setSchema(s))
      .catch(e => setProblem(e));
  }, [props.api, backend, provider]);

  const fields: StorageField[] = schema ? storageFields(schema) : [];
  const shown = fields.filter(f => advanced || !f.advanced || f.required);
  const invalid = (field: string) =>
    problem !== null && storageFieldMatches(field, problem.field) ? 'jp-mod-invalid' : '';

  const submit = async (ev: React.FormEvent) => {
    ev.preventDefault();
    setBusy(true);
    setProblem(null);
    try {
      await props.api.add(
        buildStorageRequest(name, backend, provider, fields, values, source, readWrite)
      );
      props.onDone();
    } catch (e) {
      setProblem(e instanceof ApiError ? e : new ApiError(String(e), 0));
    } finally {
      setBusy(false);
    }
  };

  return (
    <form className="jp-CloudTik-form jp-CloudTik-storageForm" onSubmit={e => void submit(e)}>
      <label className="jp-CloudTik-field">
        <span>Name</span>
        <input
          className={`jp-mod-styled ${invalid('name')}`}
          name="storage-name"
          value={name}
          onChange={e => setName(e.target.value)}
        />
      </label>
      <label className="jp-CloudTik-field">
        <span>Backend</span>
        <select
          className={`jp-mod-styled ${invalid('backend')}`}
          name="storage-backend"
          value={backend}
          onChange={e => {
            setBackend(e.target.value);
            setProvider('');
            setValues({});
          }}
        >
          {backends.map(b => (
            <option key={b.name} value={b.name} title={b.description}>
              {b.name}
            </option>
          ))}
        </select>
      </label>
      {schema && schema.providers.length > 0 && (
        <label className="jp-CloudTik-field">
          <span>Provider</span>
          <select
            className={`jp-mod-styled ${invalid('provider')}`}
            name="storage-provider"
            value={provider}
            onChange={e => setProvider(e.target.value)}
          >
            <option value="">(choose)</option>
            {schema.providers.map(p => (
              <option key={p} value={p}>
                {p}
              </option>
            ))}
          </select>
        </label>
      )}
      {shown.map(f => (
        <label key={f.name} className="jp-CloudTik-field" title={f.help}>
          <span>
            {f.title}
            {f.required ? ' *' : ''}
          </span>
          {f.kind === 'boolean' ? (
            <input
              type="checkbox"
              name={`opt-${f.name}`}
              checked={Boolean(values[f.name])}
              onChange={e => setValues({ ...values, [f.name]: e.target.checked })}
            />
          ) : f.kind === 'select' ? (
            <select
              className={`jp-mod-styled ${invalid(f.name)}`}
              name={`opt-${f.name}`}
              value={String(values[f.name] ?? '')}
              onChange={e => setValues({ ...values, [f.name]: e.target.value })}
            >
              {(f.choices ?? []).map(c => (
                <option key={c} value={c}>
                  {c || '(default)'}
                </option>
              ))}
            </select>
          ) : (
            <input
              className={`jp-mod-styled ${invalid(f.name)}`}
              name={`opt-${f.name}`}
              type={f.kind === 'password' ? 'password' : 'text'}
              autoComplete={f.kind === 'password' ? 'new-password' : 'off'}
              placeholder={f.placeholder ?? f.help}
              value={String(values[f.name] ?? '')}
              onChange={e => setValues({ ...values, [f.name]: e.target.value })}
            />
          )}
        </label>
      ))}
      <label className="jp-CloudTik-field">
        <span>Source (bucket/path)</span>
        <input
          className={`jp-mod-styled ${invalid('source')}`}
          name="storage-source"
          value={source}
          onChange={e => setSource(e.target.value)}
        />
      </label>
      <label className="jp-CloudTik-field">
        <span>Allow writes</span>
        <input
          type="checkbox"
          name="storage-read-write"
          checked={readWrite}
          onChange={e => setReadWrite(e.target.checked)}
        />
      </label>
      <label className="jp-CloudTik-field">
        <span>Show advanced options</span>
        <input
          type="checkbox"
          name="storage-advanced"
          checked={advanced}
          onChange={e => setAdvanced(e.target.checked)}
        />
      </label>
      {problem && (
        <div className="jp-CloudTik-error jp-CloudTik-formError" role="alert">
          {problem.message}
        </div>
      )}
      <div className="jp-CloudTik-formButtons">
        <button
          type="submit"
          className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-create"
          disabled={busy}
        >
          Add storage
        </button>
        <button type="button" className="jp-Button jp-mod-styled" onClick={props.onDone}>
          Cancel
        </button>
      </div>
    </form>
  );
}
