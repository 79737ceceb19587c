/** The Jobs section: HPC jobs with state badges, a live log tail, cancel, the result. */

import * as React from 'react';

import { formatAge } from '../format';
import { FINAL_JOB_STATES, Job, jobBadge, jobRuntime } from '../jobs';
import {
  formatValue,
  paramsLabel,
  PROGRESS_KIND,
  progressSegments,
  resultColumns,
  ResultRow,
  Sweep,
  sweepActive,
  sweepParameters,
  sweepSummary,
  sweepTimelineRow
} from '../sweeps';
import { JobsTimeline } from './charts';
import { useModel, useNow } from './hooks';
import { SectionProps } from './props';

export function JobsSection(props: SectionProps): JSX.Element {
  const model = props.jobs;
  useModel(model);
  const now = useNow(1);
  return (
    <div className="jp-CloudTik-jobs">
      <div className="jp-CloudTik-toolbar">
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-refreshJobs"
          title="Refresh"
          onClick={() => void model.refresh()}
        >
          Refresh
        </button>
        <span className="jp-CloudTik-count">
          {model.jobs.filter(j => !FINAL_JOB_STATES.includes(j.state)).length +
            model.sweeps.filter(sweepActive).length}{' '}
          active
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
      {model.loaded && model.jobs.length === 0 && model.sweeps.length === 0 && (
        <div className="jp-CloudTik-empty">
          No jobs. Submit a notebook with <code>%hpc submit NOTEBOOK</code> in a notebook, or{' '}
          <code>jupyter cloudtik jobs submit</code> in a terminal.
        </div>
      )}
      <JobsTimeline jobs={[...model.jobs, ...model.sweeps.map(sweepTimelineRow)]} now={now} />
      {model.sweeps.length > 0 && (
        <ul className="jp-CloudTik-list jp-CloudTik-sweepList">
          {model.sweeps.map(s => (
            <SweepItem key={s.id} sweep={s} {...props} />
          ))}
        </ul>
      )}
      <ul className="jp-CloudTik-list jp-CloudTik-jobList">
        {model.jobs.map(j => (
          <JobItem key={j.id} job={j} now={now} {...props} />
        ))}
      </ul>
    </div>
  );
}

function JobItem(props: SectionProps & { job: Job; now: number }): JSX.Element {
  const { job, jobs: model } = props;
  const selected = model.selected === job.id;
  const active = !FINAL_JOB_STATES.includes(job.state);
  const runtime = jobRuntime(job, props.now);
  const fail = (e: unknown) => model.setError(e instanceof Error ? e.message : String(e));
  const logRef = React.useRef<HTMLPreElement>(null);
  React.useEffect(() => {
    const el = logRef.current;
    if (el) {
      el.scrollTop = el.scrollHeight; // follow the tail
    }
  }, [model.log, selected]);

  const cancel = async (e: React.MouseEvent) => {
    e.stopPropagation();
    const ok = await props.confirm(
      `Cancel job ${job.name}?`,
      `Job ${job.id} on '${job.backend}' will be stopped; what it has not written yet is lost.`,
      'Cancel job'
    );
    if (ok) {
      await model.cancel(job.id).catch(fail);
    }
  };
  const open = async (e: React.MouseEvent) => {
    e.stopPropagation();
    try {
      await props.openPath(await model.fetchResult(job.id));
    } catch (err) {
      fail(err);
    }
  };

  return (
    <li
      className={`jp-CloudTik-job ${selected ? 'jp-mod-selected' : ''}`}
      data-job-id={job.id}
      data-state={job.state}
      onClick={() => model.select(selected ? null : job.id)}
    >
      <div className="jp-CloudTik-clusterHead">
        <span className="jp-CloudTik-name" title={job.id}>
          {job.name}
        </span>
        <span
          className={`jp-CloudTik-badge jp-mod-${jobBadge(job.state)}`}
          data-state={job.state}
          title={job.reason ?? job.state}
        >
          {job.state}
        </span>
      </div>
      <div className="jp-CloudTik-facts">
        <span title="backend">{job.backend}</span>
        {job.native_state && <span title="the system's own state">{job.native_state}</span>}
        {job.native_id && <span title="the job's id on its system">#{job.native_id}</span>}
        <span title="runtime" className="jp-CloudTik-runtime">
          {runtime === null ? 'not started' : formatAge(runtime)}
        </span>
      </div>
      {job.reason && job.state !== 'succeeded' && (
        <div className="jp-CloudTik-reason jp-CloudTik-jobReason">{job.reason}</div>
      )}
      {(job.warnings ?? []).map(text => (
        <div key={text} className="jp-CloudTik-reason jp-CloudTik-jobWarning" title="warning">
          warning: {text}
        </div>
      ))}
      {selected && (
        <div className="jp-CloudTik-jobDetail" onClick={e => e.stopPropagation()}>
          {job.error && (
            <pre className="jp-CloudTik-errorCell" title="the cell that raised">
              {job.error.source}
              {'\n\n'}
              {job.error.ename}: {job.error.evalue}
            </pre>
          )}
          <pre className="jp-CloudTik-log" ref={logRef}>
            {model.log || (job.native_id ? '(no output yet)' : '(not submitted yet)')}
          </pre>
          <div className="jp-CloudTik-actions">
            {active && (
              <button
                className="jp-Button jp-mod-styled jp-mod-warn jp-CloudTik-cancelJob"
                onClick={e => void cancel(e)}
              >
                Cancel
              </button>
            )}
            {!active && job.state !== 'cancelled' && job.output_notebook && job.native_id && (
              <button
                className="jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-openResult"
                onClick={e => void open(e)}
              >
                Open result
              </button>
            )}
          </div>
        </div>
      )}
    </li>
  );
}

/** A sweep's counts as one bar: a segment per state, its width the share of elements. */
export function SweepProgress(props: { sweep: Sweep }): JSX.Element {
  const { counts } = props.sweep;
  return (
    <div className="jp-CloudTik-sweepProgress" title={sweepSummary(counts)}>
      {progressSegments(counts).map(seg => (
        <span
          key={seg.state}
          className={`jp-CloudTik-sweepSegment jp-mod-${PROGRESS_KIND[seg.state]}`}
          data-state={seg.state}
          data-count={seg.count}
          style={{ left: `${seg.x}%`, width: `${seg.width}%` }}
        />
      ))}
    </div>
  );
}

function SweepItem(props: SectionProps & { sweep: Sweep }): JSX.Element {
  const { sweep, jobs: model } = props;
  const expanded = model.expanded.has(sweep.id);
  const active = sweepActive(sweep);
  const results = model.results.get(sweep.id);
  const fail = (e: unknown) => model.setError(e instanceof Error ? e.message : String(e));
  const total = sweep.elements.length;

  const cancel = async (e: React.MouseEvent) => {
    e.stopPropagation();
    const ok = await props.confirm(
      `Cancel sweep ${sweep.name}?`,
      `The ${total - sweep.counts.succeeded - sweep.counts.failed - sweep.counts.cancelled} ` +
        `elements of sweep ${sweep.id} on '${sweep.backend}' that have not ended will be stopped.`,
      'Cancel sweep'
    );
    if (ok) {
      await model.cancelSweep(sweep.id).catch(fail);
    }
  };
  const retry = async (e: React.MouseEvent) => {
    e.stopPropagation();
    await model.retrySweep(sweep.id).catch(fail);
  };
  const toggleResults = async (e: React.MouseEvent) => {
    e.stopPropagation();
    if (results) {
      model.hideResults(sweep.id);
    } else {
      await model.loadResults(sweep.id).catch(fail);
    }
  };

  return (
    <li
      className={`jp-CloudTik-job jp-CloudTik-sweep ${expanded ? 'jp-mod-selected' : ''}`}
      data-sweep-id={sweep.id}
      data-state={sweep.state}
      onClick={() => model.toggleSweep(sweep.id)}
    >
      <div className="jp-CloudTik-clusterHead">
        <span className="jp-CloudTik-name" title={sweep.id}>
          {sweep.name}
        </span>
        <span className="jp-CloudTik-sweepTag" title={`${sweep.mode} sweep`}>
          sweep ×{total}
        </span>
        <span
          className={`jp-CloudTik-badge jp-mod-${jobBadge(sweep.state)}`}
          data-state={sweep.state}
          title={sweep.state}
        >
          {sweep.state}
        </span>
      </div>
      <SweepProgress sweep={sweep} />
      <div className="jp-CloudTik-facts">
        <span className="jp-CloudTik-sweepCounts">{sweepSummary(sweep.counts)}</span>
        <span title="backend">{sweep.backend}</span>
        <span title="how it was submitted">
          {sweep.mode === 'array' ? 'one array' : 'bounded'}, {sweep.max_concurrent} at once
        </span>
      </div>
      <div className="jp-CloudTik-actions" onClick={e => e.stopPropagation()}>
        {active && (
          <button
            className="jp-Button jp-mod-styled jp-mod-warn jp-CloudTik-cancelSweep"
            onClick={e => void cancel(e)}
          >
            Cancel
          </button>
        )}
        {sweep.counts.failed > 0 && (
          <button
            className="jp-Button jp-mod-styled jp-CloudTik-retrySweep"
            title="resubmit only the failed elements"
            onClick={e => void retry(e)}
          >
            Retry failed ({sweep.counts.failed})
          </button>
        )}
        <button
          className="jp-Button jp-mod-styled jp-CloudTik-sweepResultsButton"
          title="one row per element: its parameters, state, recorded values and outputs"
          onClick={e => void toggleResults(e)}
        >
          {results ? 'Hide results' : 'Results'}
        </button>
      </div>
      {results && <SweepResults sweep={sweep} rows={results} />}
      {expanded && (
        <ul className="jp-CloudTik-sweepElements" onClick={e => e.stopPropagation()}>
          {sweep.elements.map(el => (
            <li
              key={el.index}
              className="jp-CloudTik-sweepElement"
              data-index={el.index}
              data-job-id={el.job}
              data-state={el.state}
            >
              <span className="jp-CloudTik-elementIndex">#{el.index}</span>
              <span className="jp-CloudTik-elementParams" title={el.job}>
                {paramsLabel(el.parameters)}
              </span>
              {el.native_id && <span className="jp-CloudTik-elementNative">{el.native_id}</span>}
              {el.attempts > 1 && <span title="attempts">try {el.attempts}</span>}
              <span
                className={`jp-CloudTik-badge jp-mod-${jobBadge(el.state)}`}
                data-state={el.state}
                title={el.reason ?? el.state}
              >
                {el.state}
              </span>
              {!FINAL_JOB_STATES.includes(el.state) && (
                <button
                  className="jp-Button jp-mod-minimal jp-CloudTik-cancelElement"
                  title={`cancel element ${el.index}`}
                  onClick={() => void model.cancelSweep(sweep.id, el.index).catch(fail)}
                >
                  ×
                </button>
              )}
            </li>
          ))}
        </ul>
      )}
    </li>
  );
}

function SweepResults(props: { sweep: Sweep; rows: ResultRow[] }): JSX.Element {
  const columns = resultColumns(props.rows, sweepParameters(props.sweep));
  return (
    <div className="jp-CloudTik-sweepResults" onClick={e => e.stopPropagation()}>
      <table>
        <thead>
          <tr>
            {columns.map(c => (
              <th key={c}>{c}</th>
            ))}
          </tr>
        </thead>
        <tbody>
          {props.rows.map(row => (
            <tr
              key={String(row.element)}
              data-element={String(row.element)}
              title={typeof row.unread === 'string' ? row.unread : String(row.location ?? '')}
            >
              {columns.map(c => (
                <td key={c} data-column={c}>
                  {formatValue(row[c])}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
