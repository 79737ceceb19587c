/**
 * The state behind the Jobs section: recorded HPC jobs, the selected job's log tail.
 *
 * Jobs come from `GET jobs` (the store only: cheap), refreshed when an event of a job's
 * operation arrives on the panel's one event stream, and every few seconds for the
 * runtimes.  The selected job's log is read incrementally (`jobs/<id>/logs?offset=`) while
 * it runs.
 */

import { BadgeKind } from './format';
import { CloudTikApi } from './model';
import { CloudTikEvent } from './types';
import { Observed, Refresher } from './poll';
import { ResultRow, Sweep } from './sweeps';

export interface NotebookError {
  cell: number;
  execution_count: number | null;
  ename: string;
  evalue: string;
  source: string;
}

export interface Job {
  id: string;
  name: string;
  backend: string;
  backend_type: string;
  kind: string;
  state: string;
  native_id: string | null;
  native_state: string | null;
  reason: string | null;
  exit_code: number | null;
  error: NotebookError | null;
  op_id: string | null;
  output_notebook: string | null;
  /** e.g. parameters the notebook ignores (submitted with allow_unknown_parameters) */
  warnings?: string[];
  /** the sweep this job is an element of (listed as the sweep's row, not on its own) */
  sweep?: string | null;
  created_at: number;
  submitted_at: number | null;
  started_at: number | null;
  finished_at: number | null;
}

export const FINAL_JOB_STATES = ['succeeded', 'failed', 'cancelled'];

export function jobBadge(state: string): BadgeKind {
  switch (state) {
    case 'succeeded':
      return 'ok';
    case 'running':
    case 'queued':
    case 'submitting':
      return 'busy';
    case 'unknown':
      return 'warn';
    case 'failed':
      return 'error';
    default:
      return 'off';
  }
}

/** Seconds the job has run (until now, or until it ended). */
export function jobRuntime(job: Job, now: number): number | null {
  if (!job.started_at) {
    return null;
  }
  return (job.finished_at ?? now) - job.started_at;
}

/** The jobs list leaves out sweeps' elements: each sweep is one row (GET jobs/sweeps). */
export const JOBS_PATH = 'jobs?limit=50&sweep_elements=false';
export const SWEEPS_PATH = 'jobs/sweeps?limit=20';

export class JobsModel extends Observed {
  jobs: Job[] = [];
  sweeps: Sweep[] = [];
  /** the sweeps shown with their elements */
  expanded = new Set<string>();
  /** results tables read, by sweep id (read again on "Results") */
  results = new Map<string, ResultRow[]>();
  error: string | null = null;
  loaded = false;
  /** the job whose log is shown */
  selected: string | null = null;
  log = '';
  logOffset = 0;

  private readonly poller = new Refresher(() => this.refresh(), {
    seconds: 10,
    soonMs: 200,
    name: 'cloudtik:jobs'
  });
  private tailTimer: ReturnType<typeof setTimeout> | null = null;
  private tailing = false;

  constructor(
    readonly api: CloudTikApi,
    readonly tailSeconds = 1
  ) {
    super();
  }

  async start(refreshSeconds = 10): Promise<void> {
    await this.refresh();
    this.loaded = true;
    this.changed();
    this.setRefresh(refreshSeconds);
  }

  setRefresh(seconds: number): void {
    this.poller.start(seconds);
  }

  stop(): void {
    this.poller.stop();
    if (this.tailTimer !== null) {
      clearTimeout(this.tailTimer);
      this.tailTimer = null;
    }
  }

  job(id: string | null): Job | undefined {
    return this.jobs.find(j => j.id === id);
  }

  sweep(id: string): Sweep | undefined {
    return this.sweeps.find(s => s.id === id);
  }

  /** An event from the panel's stream: a job's operation moved, so its row may have (a
   * sweep's element is a job: its sweep's counts may have moved). */
  handleEvent(event: CloudTikEvent): void {
    const ours =
      this.jobs.some(j => j.op_id === event.op_id) ||
      this.sweeps.some(s => s.elements.some(e => e.op_id === event.op_id));
    const newJob = event.step === 'start' && event.message.startsWith('hpc.job ');
    if (ours || newJob) {
      this.queueRefresh();
    }
  }

  private queueRefresh(): void {
    this.poller.soon();
  }

  async refresh(): Promise<void> {
    try {
      const [data, sweeps] = await Promise.all([
        this.api.request<{ jobs: Job[] }>(JOBS_PATH),
        this.api.request<{ sweeps: Sweep[] }>(SWEEPS_PATH)
      ]);
      this.jobs = data.jobs;
      this.sweeps = sweeps.sweeps;
      this.changed();
    } catch (e) {
      this.setError(e instanceof Error ? e.message : String(e));
    }
  }

  /** Show this job's log (read from the start, then followed while the job runs). */
  select(id: string | null): void {
    if (this.selected === id) {
      return;
    }
    this.selected = id;
    this.log = '';
    this.logOffset = 0;
    if (this.tailTimer !== null) {
      clearTimeout(this.tailTimer);
      this.tailTimer = null;
    }
    this.changed();
    if (id !== null) {
      void this.tail();
    }
  }

  /** Read what the selected job's log has beyond what we have; again soon while it runs. */
  async tail(): Promise<void> {
    const id = this.selected;
    if (id === null || this.tailing) {
      return;
    }
    this.tailing = true;
    let again = false;
    try {
      const data = await this.api.request<{
        text: string;
        offset: number;
        eof: boolean;
        done: boolean;
      }>(`jobs/${encodeURIComponent(id)}/logs?offset=${this.logOffset}`);
      if (this.selected !== id) {
        return; // the user picked another job meanwhile
      }
      if (data.offset > this.logOffset) {
        this.log += data.text;
        this.logOffset = data.offset;
        this.changed();
      }
      again = !data.done || !data.eof;
    } catch (e) {
      this.setError(e instanceof Error ? e.message : String(e));
    } finally {
      this.tailing = false;
    }
    if (again && this.selected === id) {
      this.tailTimer = setTimeout(() => void this.tail(), this.tailSeconds * 1000);
    }
  }

  async cancel(id: string): Promise<void> {
    const job = await this.api.request<Job>(`jobs/${encodeURIComponent(id)}`, {
      method: 'DELETE'
    });
    this.jobs = this.jobs.map(j => (j.id === job.id ? job : j));
    this.changed();
  }

  /** Copy the executed notebook and results under the root folder; its path to open. */
  async fetchResult(id: string): Promise<string> {
    const data = await this.api.request<{ output_notebook: string | null; dest: string }>(
      `jobs/${encodeURIComponent(id)}/fetch`,
      { method: 'POST', body: {} }
    );
    if (!data.output_notebook) {
      throw new Error(`job ${id} has no executed notebook; its results are in ${data.dest}`);
    }
    return data.output_notebook;
  }

  /** Show or hide a sweep's elements. */
  toggleSweep(id: string): void {
    if (this.expanded.has(id)) {
      this.expanded.delete(id);
    } else {
      this.expanded.add(id);
    }
    this.changed();
  }

  private replaceSweep(sweep: Sweep): void {
    this.sweeps = this.sweeps.some(s => s.id === sweep.id)
      ? this.sweeps.map(s => (s.id === sweep.id ? sweep : s))
      : [sweep, ...this.sweeps];
    this.changed();
  }

  /** Cancel the whole sweep, or with `element` that element only. */
  async cancelSweep(id: string, element?: number): Promise<void> {
    const path = `jobs/sweeps/${encodeURIComponent(id)}/cancel`;
    const body = element === undefined ? {} : { element };
    this.replaceSweep(await this.api.request<Sweep>(path, { method: 'POST', body }));
  }

  /** Resubmit the sweep's failed elements only. */
  async retrySweep(id: string): Promise<void> {
    const path = `jobs/sweeps/${encodeURIComponent(id)}/retry`;
    this.replaceSweep(await this.api.request<Sweep>(path, { method: 'POST', body: {} }));
  }

  /** Read the sweep's results table (one row per element). */
  async loadResults(id: string): Promise<void> {
    const data = await this.api.request<{ sweep: string; rows: ResultRow[] }>(
      `jobs/sweeps/${encodeURIComponent(id)}/results`
    );
    this.results.set(id, data.rows);
    this.changed();
  }

  hideResults(id: string): void {
    this.results.delete(id);
    this.changed();
  }

  setError(message: string | null): void {
    this.error = message;
    this.changed();
  }
}
