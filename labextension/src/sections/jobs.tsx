/** The Jobs section: HPC jobs with state badges, a live log tail, cancel, the result. */

import * as React from 'react';

import { formatAge } from '../format';
import { FINAL_JOB_STATES, Job, jobBadge, jobRuntime } from '../jobs';
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
          {model.jobs.filter(j => !FINAL_JOB_STATES.includes(j.state)).length} active
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
      {model.loaded && model.jobs.length === 0 && (
        <div className="jp-CloudTik-empty">
          No jobs. Submit a notebook with <code>%hpc submit NOTEBOOK</code> in a notebook, or{' '}
          <code>jupyter cloudtik jobs submit</code> in a terminal.
        </div>
      )}
      <JobsTimeline jobs={model.jobs} now={now} />
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
