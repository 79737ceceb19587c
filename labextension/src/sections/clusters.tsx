/** The Clusters section: list, New form, Scale, Shut down, client code, live progress. */

import * as React from 'react';

import { DASHBOARD_PAGES, pageUrl } from '../dashboards';
import { badgeKind, clientCode, formatAge, formatBytes } from '../format';
import {
  buildCreateRequest,
  clusterFields,
  FieldSpec,
  fieldMatches,
  FormValues,
  initialValues,
  isCatalogEntry
} from '../form';
import { ApiError, ClustersModel, Usage } from '../model';
import { OperationRow } from '../operations';
import { Cluster, ProviderInfo } from '../types';
import { useModel, useNow } from './hooks';
import { SectionProps } from './props';
import { UsageCharts } from './charts';

export function ClustersSection(props: SectionProps): JSX.Element {
  const model = props.clusters;
  useModel(model);
  const now = useNow(1);
  const [creating, setCreating] = React.useState(false);
  // operations of other features (jobs, storage) show in their own sections
  const rows = model.ops
    .visible(now)
    .filter(r => r.kind.startsWith('cluster.') || r.kind === 'operation');
  return (
    <div className="jp-CloudTik-clusters">
      <div className="jp-CloudTik-toolbar">
        <button
          className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-new"
          onClick={() => setCreating(!creating)}
        >
          New
        </button>
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-refresh"
          title="Refresh"
          onClick={() => void model.refresh()}
        >
          Refresh
        </button>
        <span
          className={`jp-CloudTik-live ${model.live ? 'jp-mod-live' : ''}`}
          title={model.live ? 'live: progress is pushed by the server' : 'reconnecting…'}
        >
          {model.live ? '● live' : '○ offline'}
        </span>
      </div>
      {model.error && (
        <div className="jp-CloudTik-error" role="alert">
          <span className="jp-CloudTik-errorText">{model.error}</span>
          <button className="jp-CloudTik-dismiss" onClick={() => model.setError(null)}>
            ×
          </button>
        </div>
      )}
      {creating && (
        <NewClusterForm
          model={model}
          preferences={props.preferences}
          onDone={() => setCreating(false)}
        />
      )}
      {rows.length > 0 && (
        <div className="jp-CloudTik-ops">
          {rows.map(row => (
            <ProgressRow key={row.id} row={row} model={model} />
          ))}
        </div>
      )}
      {/* not while the form is open or an operation runs: its row is what happens */}
      {model.loaded &&
        model.clusters.length === 0 &&
        !creating &&
        !rows.some(row => row.finishedAt === null) && (
          <div className="jp-CloudTik-empty">
            No clusters. Start one with <b>New</b>, or <code>%cluster up</code> in a notebook.
          </div>
        )}
      <ul className="jp-CloudTik-list">
        {model.clusters.map(c => (
          <ClusterItem key={c.name} cluster={c} {...props} />
        ))}
      </ul>
    </div>
  );
}

function ProgressRow(props: { row: OperationRow; model: ClustersModel }): JSX.Element {
  const { row } = props;
  const done = row.finishedAt !== null;
  return (
    <div
      className={`jp-CloudTik-op jp-mod-${row.state}`}
      data-op-id={row.id}
      data-state={row.state}
    >
      <div className="jp-CloudTik-opTitle">
        <span>
          {row.kind.replace('cluster.', '')} <b>{row.cluster}</b>
        </span>
        {!done && (
          <button
            className="jp-CloudTik-cancel"
            title="Cancel this operation"
            onClick={() => void props.model.cancel(row.id).catch(e => props.model.setError(e.message))}
          >
            Cancel
          </button>
        )}
      </div>
      <progress max={1} value={row.state === 'succeeded' ? 1 : row.fraction} />
      <div className="jp-CloudTik-opStep">
        {row.state === 'failed' && row.error ? row.error : `${row.step}: ${row.message}`}
      </div>
    </div>
  );
}

/** The cluster's life as small charts (./charts.tsx): workers and cost so far, and its
 * workers' CPU and memory use, each with labelled axes; refreshed every 10 s. */
function UsageChart(props: { model: ClustersModel; name: string; now: number }): JSX.Element | null {
  const [usage, setUsage] = React.useState<Usage | null>(null);
  const tick = Math.floor(props.now / 10);
  React.useEffect(() => {
    let alive = true;
    props.model
      .usage(props.name)
      .then(u => alive && setUsage(u))
      .catch(() => undefined);
    return () => {
      alive = false;
    };
  }, [props.name, tick]);
  if (!usage || usage.samples.length === 0) {
    return null;
  }
  return <UsageCharts usage={usage} now={props.now} />;
}

function ClusterItem(props: SectionProps & { cluster: Cluster }): JSX.Element {
  const { cluster, clusters: model } = props;
  const [scaling, setScaling] = React.useState(false);
  const [workers, setWorkers] = React.useState(String(cluster.summary.wanted_workers));
  const [adaptive, setAdaptive] = React.useState(false);
  const [minimum, setMinimum] = React.useState('1');
  const s = cluster.summary;
  const busy = model.ops.forCluster(cluster.name).length > 0;
  const fail = (e: unknown) => model.setError(e instanceof Error ? e.message : String(e));

  const scale = async () => {
    const n = Number(workers);
    try {
      if (adaptive) {
        // the server adapts between the bounds; the number field is the maximum
        await model.adapt(cluster.name, Number(minimum), n);
        setScaling(false);
        return;
      }
      await model.adaptOff(cluster.name).catch(() => undefined);
      await model.scale(cluster.name, Number.isInteger(n) ? n : (workers as any));
      setScaling(false);
    } catch (e) {
      fail(e);
    }
  };
  const shutdown = async () => {
    if (props.preferences.confirmShutdown) {
      const ok = await props.confirm(
        `Shut down cluster ${cluster.name}?`,
        `All ${cluster.nodes.length} node(s) of '${cluster.name}' will be stopped; ` +
          'work that is not saved elsewhere is lost.',
        'Shut down'
      );
      if (!ok) {
        return;
      }
    }
    try {
      await model.shutdown(cluster.name);
    } catch (e) {
      fail(e);
    }
  };
  const insert = async () => {
    try {
      await props.insertCode(clientCode(cluster.name));
    } catch (e) {
      fail(e);
    }
  };

  return (
    <li className="jp-CloudTik-cluster" data-name={cluster.name} data-state={cluster.state}>
      <div className="jp-CloudTik-clusterHead">
        <span className="jp-CloudTik-name">{cluster.name}</span>
        <span
          className={`jp-CloudTik-badge jp-mod-${badgeKind(cluster.state)}`}
          data-state={cluster.state}
          title={cluster.reason ?? cluster.state}
        >
          {cluster.state}
        </span>
      </div>
      <div className="jp-CloudTik-facts">
        <span title="provider">{cluster.provider}</span>
        <span title="nodes (head and workers)" className="jp-CloudTik-nodes">
          {cluster.nodes.length} nodes
        </span>
        <span title="running workers / wanted" className="jp-CloudTik-workers">
          {s.workers}/{s.wanted_workers} workers
        </span>
        <span title="cores">{s.cores} cores</span>
        <span title="memory">{formatBytes(s.memory)}</span>
        <span title="age">{formatAge(s.age_seconds)}</span>
      </div>
      <UsageChart model={model} name={cluster.name} now={Date.now() / 1000} />
      {cluster.reason && cluster.state !== 'running' && (
        <div className="jp-CloudTik-reason">{cluster.reason}</div>
      )}
      {(cluster.last_operation?.warnings ?? []).map(text => (
        <div key={text} className="jp-CloudTik-reason jp-CloudTik-clusterWarning" title="warning">
          warning: {text}
        </div>
      ))}
      <div className="jp-CloudTik-actions">
        {cluster.spark_ui_link && (
          <a
            className="jp-CloudTik-sparkUI"
            href={cluster.spark_ui_link}
            target="_blank"
            rel="noopener noreferrer"
            title="The Spark UI: the master, its workers and the running applications"
          >
            Spark UI
          </a>
        )}
        {cluster.dashboard_link && cluster.dashboard_link !== cluster.spark_ui_link && (
          <a
            className="jp-CloudTik-dashboard"
            href={cluster.dashboard_link}
            target="_blank"
            rel="noopener noreferrer"
          >
            Dashboard
          </a>
        )}
        {cluster.dashboard_link &&
          cluster.dashboard_link !== cluster.spark_ui_link &&
          props.openDashboard && (
          <select
            className="jp-mod-styled jp-CloudTik-plots"
            title="Open the dashboard or one of its plots as a JupyterLab tab"
            value=""
            onChange={e => {
              const page = e.target.value;
              if (page && cluster.dashboard_link) {
                props
                  .openDashboard!(cluster.name, page, pageUrl(cluster.dashboard_link, page))
                  .catch(fail);
              }
            }}
          >
            <option value="">Open in tab…</option>
            {DASHBOARD_PAGES.map(p => (
              <option key={p.page} value={p.page}>
                {p.label}
              </option>
            ))}
          </select>
        )}
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-scale"
          disabled={cluster.state === 'stopping'}
          onClick={() => setScaling(!scaling)}
        >
          Scale
        </button>
        <button className="jp-Button jp-mod-styled jp-CloudTik-insert" onClick={() => void insert()}>
          Insert client code
        </button>
        <button
          className="jp-Button jp-mod-styled jp-mod-warn jp-CloudTik-shutdown"
          disabled={cluster.state === 'stopping' || (busy && cluster.state === 'stopping')}
          onClick={() => void shutdown()}
        >
          Shut down
        </button>
      </div>
      {scaling && (
        <div className="jp-CloudTik-scaleForm">
          <label>
            Workers
            <input
              className="jp-mod-styled"
              name="scale-workers"
              type="number"
              min={0}
              value={workers}
              onChange={e => setWorkers(e.target.value)}
            />
          </label>
          <label title="Scale with the scheduler's load; the server runs it, so it goes on when notebooks are closed">
            <input
              className="jp-CloudTik-adaptive"
              type="checkbox"
              checked={adaptive}
              onChange={e => setAdaptive(e.target.checked)}
            />
            Adaptive
          </label>
          {adaptive && (
            <label>
              Min
              <input
                className="jp-mod-styled"
                name="adapt-minimum"
                type="number"
                min={0}
                value={minimum}
                onChange={e => setMinimum(e.target.value)}
              />
            </label>
          )}
          <button className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-apply" onClick={() => void scale()}>
            Apply
          </button>
        </div>
      )}
    </li>
  );
}

function NewClusterForm(props: {
  model: ClustersModel;
  preferences: SectionProps['preferences'];
  onDone: () => void;
}): JSX.Element {
  const { model, preferences } = props;
  const available = model.providers.filter(p => p.available);
  const preferred =
    available.find(p => p.name === preferences.defaultProvider) ??
    available.find(p => p.name === model.defaultProvider) ??
    available[0];
  const [providerName, setProviderName] = React.useState(preferred?.name ?? '');
  const provider: ProviderInfo | undefined = available.find(p => p.name === providerName);
  // the names listed when the form opened (a later refresh must not reset what is typed)
  const [taken] = React.useState(() => model.clusters.map(c => c.name));
  const fields = React.useMemo(
    () =>
      provider ? clusterFields(provider, preferences.defaultWorkers, model.runtimes, taken) : [],
    [provider, preferences.defaultWorkers, model.runtimes, taken]
  );
  const [values, setValues] = React.useState<FormValues>(() => initialValues(fields));
  React.useEffect(() => setValues(initialValues(fields)), [fields]);
  const [error, setError] = React.useState<ApiError | null>(null);
  const [submitting, setSubmitting] = React.useState(false);

  if (!provider) {
    return (
      <div className="jp-CloudTik-form jp-CloudTik-error">
        No provider is available here.
        {model.providers.map(p => (
          <div key={p.name}>
            {p.name}: {p.reason}
          </div>
        ))}
      </div>
    );
  }

  const submit = async (e: React.FormEvent) => {
    e.preventDefault();
    setSubmitting(true);
    setError(null);
    try {
      await model.create(buildCreateRequest(provider, fields, values));
      props.onDone();
    } catch (err) {
      setError(err instanceof ApiError ? err : new ApiError(String(err), 0));
    } finally {
      setSubmitting(false);
    }
  };

  return (
    <form className="jp-CloudTik-form" onSubmit={e => void submit(e)}>
      <label className="jp-CloudTik-field">
        <span>Provider</span>
        <select
          className="jp-mod-styled"
          name="provider"
          value={providerName}
          onChange={e => setProviderName(e.target.value)}
        >
          {available.map(p => (
            <option key={p.name} value={p.name}>
              {p.title ?? p.name}
            </option>
          ))}
        </select>
      </label>
      {isCatalogEntry(provider) && (
        <div className="jp-CloudTik-providerDescription" data-kind={provider.kind}>
          {provider.description ||
            `${provider.name}: ${provider.provider_type ?? ''} ${provider.kind} of your hub`}
          <div className="jp-CloudTik-providerNote">
            Its provider settings are set by the hub&apos;s administrator.
          </div>
        </div>
      )}
      {fields.map(f => (
        <Field
          key={f.key}
          field={f}
          value={values[f.key]}
          invalid={error?.field !== null && error?.field !== undefined && fieldMatches(f, error.field)}
          onChange={v => setValues({ ...values, [f.key]: v })}
        />
      ))}
      {error && (
        <div className="jp-CloudTik-error jp-CloudTik-formError" role="alert">
          {error.message}
        </div>
      )}
      <div className="jp-CloudTik-formButtons">
        <button
          type="submit"
          className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-start"
          disabled={submitting}
        >
          Start
        </button>
        <button type="button" className="jp-Button jp-mod-styled" onClick={props.onDone}>
          Cancel
        </button>
      </div>
    </form>
  );
}

function Field(props: {
  field: FieldSpec;
  value: unknown;
  invalid: boolean;
  onChange: (value: unknown) => void;
}): JSX.Element {
  const { field, value } = props;
  const cls = `jp-mod-styled ${props.invalid ? 'jp-mod-invalid' : ''}`;
  let input: JSX.Element;
  if (field.kind === 'enum') {
    input = (
      <select
        className={cls}
        name={field.key}
        value={value === undefined ? '' : String(value)}
        onChange={e => props.onChange(e.target.value)}
      >
        {field.default === undefined && <option value="">(default)</option>}
        {(field.options ?? []).map(o => (
          <option key={o} value={o}>
            {o}
          </option>
        ))}
      </select>
    );
  } else if (field.kind === 'boolean') {
    input = (
      <input
        type="checkbox"
        name={field.key}
        checked={Boolean(value)}
        onChange={e => props.onChange(e.target.checked)}
      />
    );
  } else {
    input = (
      <input
        className={cls}
        name={field.key}
        type="text"
        inputMode={field.kind === 'string' ? undefined : 'numeric'}
        placeholder={field.placeholder}
        value={value === undefined || value === null ? '' : String(value)}
        onChange={e => props.onChange(e.target.value)}
      />
    );
  }
  return (
    <label className="jp-CloudTik-field" title={field.description}>
      <span>{field.title}</span>
      {input}
    </label>
  );
}
