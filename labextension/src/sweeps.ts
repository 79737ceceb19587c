/**
 * Parameter sweeps in the Jobs section: one row per sweep (`GET jobs/sweeps`) with its
 * elements' counts by state as a progress bar, its elements, and its results table
 * (`GET jobs/sweeps/<id>/results`).  The geometry and wording here are pure functions
 * (tested in test/sweeps.spec.ts); the model calls are in jobs.ts (one poller for both).
 */

import { BadgeKind } from './format';
import type { TimelineJob } from './usage';

export interface SweepElement {
  index: number;
  job: string;
  op_id?: string | null;
  state: string;
  native_id: string | null;
  native_state: string | null;
  parameters: Record<string, unknown>;
  reason: string | null;
  attempts: number;
  started_at: number | null;
  finished_at: number | null;
}

export interface SweepCounts {
  queued: number;
  running: number;
  succeeded: number;
  failed: number;
  cancelled: number;
  unknown: number;
}

export interface Sweep {
  id: string;
  name: string;
  backend: string;
  mode: string;
  state: string;
  max_concurrent: number;
  notebook: string | null;
  counts: SweepCounts;
  elements: SweepElement[];
  user?: string | null;
  created_at: number;
}

/** One row of a sweep's results table (element, job, state, parameters, recorded values,
 * outputs, crate, location, reason, and unread when its values were not read). */
export type ResultRow = Record<string, unknown>;

/** The order the progress bar shows states in: ended first, then what is still to come. */
export const PROGRESS_ORDER: (keyof SweepCounts)[] = [
  'succeeded',
  'failed',
  'cancelled',
  'running',
  'queued',
  'unknown'
];

export const PROGRESS_KIND: Record<keyof SweepCounts, BadgeKind | 'queued'> = {
  succeeded: 'ok',
  failed: 'error',
  cancelled: 'off',
  running: 'busy',
  queued: 'queued',
  unknown: 'warn'
};

export interface Segment {
  state: keyof SweepCounts;
  count: number;
  /** left edge and width in percent of the bar */
  x: number;
  width: number;
}

export function sweepTotal(counts: SweepCounts): number {
  return PROGRESS_ORDER.reduce((n, k) => n + (counts[k] ?? 0), 0);
}

/** The progress bar's segments: one per state with elements, widths proportional to the
 * counts, side by side from 0 to exactly 100 (the last one takes the rounding rest). */
export function progressSegments(counts: SweepCounts): Segment[] {
  const total = sweepTotal(counts);
  if (!total) {
    return [];
  }
  const out: Segment[] = [];
  let x = 0;
  let seen = 0;
  for (const state of PROGRESS_ORDER) {
    const count = counts[state] ?? 0;
    if (count <= 0) {
      continue;
    }
    seen += count;
    const end = seen === total ? 100 : Math.round((seen / total) * 10000) / 100;
    out.push({ state, count, x, width: Math.round((end - x) * 100) / 100 });
    x = end;
  }
  return out;
}

/** "4/6 ended · 1 failed · 2 running": the counts in words, the ones that are not 0. */
export function sweepSummary(counts: SweepCounts): string {
  const total = sweepTotal(counts);
  const ended = counts.succeeded + counts.failed + counts.cancelled;
  const parts = [`${ended}/${total} ended`];
  for (const state of ['failed', 'cancelled', 'running', 'queued', 'unknown'] as const) {
    if (counts[state]) {
      parts.push(`${counts[state]} ${state}`);
    }
  }
  return parts.join(' · ');
}

export function sweepActive(sweep: Sweep): boolean {
  return ['queued', 'running', 'unknown'].includes(sweep.state);
}

/** An element's parameters as one short line: `alpha=0.1, n=10`. */
export function paramsLabel(params: Record<string, unknown>): string {
  return Object.entries(params)
    .map(([k, v]) => `${k}=${formatValue(v)}`)
    .join(', ');
}

/** A value in a table cell: numbers to 4 significant digits, lists joined, the rest as
 * JSON, at most `max` characters. */
export function formatValue(value: unknown, max = 60): string {
  let text: string;
  if (value === null || value === undefined) {
    text = '';
  } else if (typeof value === 'number') {
    text = Number.isInteger(value) || !Number.isFinite(value) ? String(value) : String(Number(value.toPrecision(4)));
  } else if (typeof value === 'string') {
    text = value;
  } else if (Array.isArray(value) && value.every(v => typeof v !== 'object' || v === null)) {
    text = value.map(v => formatValue(v, max)).join(', ');
  } else {
    text = JSON.stringify(value) ?? String(value);
  }
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Keys of a results row that are about the element, not values it has or recorded. */
const ROW_META = ['element', 'job', 'state', 'outputs', 'crate', 'location', 'reason', 'unread'];

/** The results table's columns: element and state, the sweep's parameters (in the order the
 * first element gives them), every recorded value (in order of first appearance), outputs. */
export function resultColumns(rows: ResultRow[], parameters: string[]): string[] {
  const params = parameters.filter(p => !ROW_META.includes(p));
  const recorded: string[] = [];
  for (const row of rows) {
    for (const key of Object.keys(row)) {
      if (!ROW_META.includes(key) && !params.includes(key) && !recorded.includes(key)) {
        recorded.push(key);
      }
    }
  }
  return ['element', 'state', ...params, ...recorded, 'outputs'];
}

/** The parameter names of a sweep: its first element's, then any another element adds. */
export function sweepParameters(sweep: Sweep): string[] {
  const out: string[] = [];
  for (const e of sweep.elements) {
    for (const k of Object.keys(e.parameters)) {
      if (!out.includes(k)) {
        out.push(k);
      }
    }
  }
  return out;
}

/** A sweep as one row of the jobs timeline (its elements are not rows of their own):
 * waiting from its creation, running from its first element's start, ended at its last
 * element's end once the sweep has ended; its counts on the row and in its tooltip. */
export function sweepTimelineRow(sweep: Sweep): TimelineJob {
  const known = (ts: (number | null)[]) => ts.filter((t): t is number => t !== null);
  const starts = known(sweep.elements.map(e => e.started_at));
  const ends = known(sweep.elements.map(e => e.finished_at));
  const { counts } = sweep;
  return {
    id: sweep.id,
    name: sweep.name,
    state: sweep.state,
    created_at: sweep.created_at,
    submitted_at: sweep.created_at,
    started_at: starts.length ? Math.min(...starts) : null,
    finished_at: sweepActive(sweep) ? null : ends.length ? Math.max(...ends) : sweep.created_at,
    sweepRow: {
      total: sweepTotal(counts),
      ended: counts.succeeded + counts.failed + counts.cancelled,
      summary: sweepSummary(counts)
    }
  };
}
