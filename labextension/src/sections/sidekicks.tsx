/** The Side-kicks section (under JupyterHub only): start, stop and open your side-kicks. */

import * as React from 'react';

import { formatAge } from '../format';
import {
  canStart,
  canStop,
  healthText,
  openUrl,
  Sidekick,
  sidekickBadge,
  SidekicksModel
} from '../sidekicks';
import { useModel, useNow } from './hooks';
import { SectionProps } from './props';

/** Is the section there at all?  Only when whoami answered (we are under a hub). */
export function useSidekicksVisible(props: SectionProps): boolean {
  useModel(props.sidekicks);
  return props.sidekicks.enabled === true;
}

export function SidekicksSection(props: SectionProps): JSX.Element {
  const model = props.sidekicks;
  useModel(model);
  const now = useNow(1);
  // poll while the section is open
  React.useEffect(() => model.watch(), [model]);
  return (
    <div className="jp-CloudTik-sidekicks">
      <div className="jp-CloudTik-toolbar">
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-refreshSidekicks"
          title="Refresh"
          onClick={() => void model.refresh(true)}
        >
          Refresh
        </button>
        {model.whoami && (
          <span className="jp-CloudTik-count" title={model.whoami.groups.join(', ')}>
            {model.whoami.name}
          </span>
        )}
      </div>
      {model.error && (
        <div className="jp-CloudTik-error" role="alert">
          <span className="jp-CloudTik-errorText">{model.error}</span>
          <button className="jp-CloudTik-dismiss" onClick={() => model.setError(null)}>
            ×
          </button>
        </div>
      )}
      {model.listError && (
        <div className="jp-CloudTik-error jp-CloudTik-listError" role="alert">
          <span className="jp-CloudTik-errorText">{model.listError}</span>
        </div>
      )}
      {model.loaded && !model.listError && model.sidekicks.length === 0 && (
        <div className="jp-CloudTik-empty">
          No side-kicks for you yet: an administrator defines them in the hub&apos;s catalogue.
        </div>
      )}
      <ul className="jp-CloudTik-list jp-CloudTik-sidekickList">
        {model.sidekicks.map(s => (
          <SidekickItem key={s.name} sidekick={s} model={model} now={now} />
        ))}
      </ul>
    </div>
  );
}

function SidekickItem(props: {
  sidekick: Sidekick;
  model: SidekicksModel;
  now: number;
}): JSX.Element {
  const { sidekick: s, model, now } = props;
  const state = model.stateOf(s);
  const busy = model.pending.has(s.name);
  const inst = s.instance;
  const url = busy ? null : openUrl(s);
  const up = inst && inst.started_at && state !== 'stopped' ? now - inst.started_at : null;
  return (
    <li className="jp-CloudTik-sidekick" data-name={s.name} data-state={state}>
      <div className="jp-CloudTik-clusterHead">
        <span className="jp-CloudTik-name">{s.name}</span>
        <span
          className={`jp-CloudTik-badge jp-mod-${sidekickBadge(state)}`}
          data-state={state}
          title={inst?.reason ?? state}
        >
          {state}
        </span>
      </div>
      {s.description && <div className="jp-CloudTik-description">{s.description}</div>}
      {inst && state !== 'stopped' && (
        <div className="jp-CloudTik-facts">
          <span title="restarts" className="jp-CloudTik-restarts">
            {inst.restarts} restart{inst.restarts === 1 ? '' : 's'}
          </span>
          <span
            title="last health check"
            className={`jp-CloudTik-health ${inst.last_health?.ok ? 'jp-mod-ok' : ''}`}
          >
            {healthText(inst.last_health, now)}
          </span>
          {up !== null && <span title="up for">{formatAge(up)}</span>}
        </div>
      )}
      {inst?.reason && state !== 'running' && (
        <div className="jp-CloudTik-reason">{inst.reason}</div>
      )}
      <div className="jp-CloudTik-actions">
        {url && (
          <a
            className="jp-CloudTik-sidekickOpen"
            href={url}
            target="_blank"
            rel="noopener noreferrer"
          >
            Open
          </a>
        )}
        {canStart(state) && (
          <button
            className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-sidekickStart"
            disabled={busy}
            onClick={() => void model.startSidekick(s.name)}
          >
            Start
          </button>
        )}
        {(canStop(state) || state === 'stopping') && (
          <button
            className="jp-Button jp-mod-styled jp-mod-warn jp-CloudTik-sidekickStop"
            disabled={busy}
            onClick={() => void model.stopSidekick(s.name)}
          >
            Stop
          </button>
        )}
      </div>
    </li>
  );
}
