/**
 * Live progress rows: what each running operation is doing, from its events.
 *
 * Events arrive from one stream of all operations; each is applied once (ids only grow),
 * so a resumed stream or a catch-up fetch that repeats events changes nothing.
 */

import { CloudTikEvent, Operation, OperationResource } from './types';

export const FINAL_STEPS = ['succeeded', 'failed', 'cancelled'];

export interface OperationRow {
  id: string;
  kind: string;
  cluster: string;
  state: string;
  fraction: number;
  step: string;
  message: string;
  level: string;
  lastEventId: number;
  startedAt: number;
  finishedAt: number | null;
  /** the server's message when the operation failed */
  error: string | null;
}

/** The name an operation works on: its structured `resource` (servers before it sent
 * only the `kind:name` string, read here and nowhere else). */
export function resourceName(op: { target?: string; resource?: OperationResource }): string {
  if (op.resource) {
    return op.resource.name;
  }
  const target = op.target ?? '';
  const i = target.indexOf(':');
  return i >= 0 ? target.slice(i + 1) : target;
}

export class OperationTracker {
  readonly rows = new Map<string, OperationRow>();

  /** Add (or update) a row from an operation record. */
  addOperation(op: Operation): OperationRow {
    const row = this.rows.get(op.id) ?? {
      id: op.id,
      kind: op.kind,
      cluster: resourceName(op),
      state: op.state,
      fraction: 0,
      step: '',
      message: '',
      level: 'info',
      lastEventId: 0,
      startedAt: op.created_at,
      finishedAt: op.finished_at,
      error: null
    };
    row.kind = op.kind;
    row.cluster = resourceName(op);
    if (FINAL_STEPS.includes(op.state)) {
      row.state = op.state;
      row.finishedAt = op.finished_at;
      if (op.state === 'failed') {
        row.error = op.reason;
      }
    } else if (!FINAL_STEPS.includes(row.state)) {
      row.state = op.state;
    }
    this.rows.set(op.id, row);
    return row;
  }

  /** Apply one event; returns the row it changed, or null when it was already applied. */
  apply(event: CloudTikEvent): OperationRow | null {
    let row = this.rows.get(event.op_id);
    if (!row) {
      // an operation started elsewhere (a notebook, the CLI): its first event says what
      const start = event.step === 'start' ? event.data : {};
      const resource = start.resource as OperationResource | undefined;
      row = {
        id: event.op_id,
        kind: (start.kind as string | undefined) || 'operation',
        cluster: resource ? resource.name : '',
        state: 'running',
        fraction: 0,
        step: '',
        message: '',
        level: 'info',
        lastEventId: 0,
        startedAt: event.ts,
        finishedAt: null,
        error: null
      };
      this.rows.set(event.op_id, row);
    }
    if (event.id <= row.lastEventId) {
      return null;
    }
    row.lastEventId = event.id;
    if (event.fraction !== null && event.fraction !== undefined) {
      row.fraction = event.fraction;
    }
    row.step = event.step;
    row.message = event.message;
    row.level = event.level;
    if (FINAL_STEPS.includes(event.step)) {
      row.state = event.step;
      row.finishedAt = event.ts;
      if (event.step === 'failed') {
        row.error = event.message;
      }
    }
    return row;
  }

  /** Is this row's operation known only by its id (started elsewhere, first event missed)? */
  needsDetails(row: OperationRow): boolean {
    return row.cluster === '';
  }

  active(): OperationRow[] {
    return [...this.rows.values()].filter(r => !FINAL_STEPS.includes(r.state));
  }

  /** Rows to show: running ones, and finished ones for `keepSeconds` (failures longer). */
  visible(now: number, keepSeconds = 8): OperationRow[] {
    return [...this.rows.values()]
      .filter(r => {
        if (r.finishedAt === null) {
          return true;
        }
        const keep = r.state === 'failed' ? keepSeconds * 8 : keepSeconds;
        return now - r.finishedAt < keep;
      })
      .sort((a, b) => a.startedAt - b.startedAt);
  }

  forCluster(name: string): OperationRow[] {
    return this.active().filter(r => r.cluster === name);
  }
}
