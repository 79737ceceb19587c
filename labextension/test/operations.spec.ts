import { describe, expect, it } from 'vitest';

import { OperationTracker } from '../src/operations';
import { CloudTikEvent, Operation } from '../src/types';

function ev(id: number, step: string, message: string, fraction: number | null = null,
            op = 'op1', data: Record<string, unknown> = {}): CloudTikEvent {
  return { id, op_id: op, ts: 1000 + id, step, message, fraction, level: 'info', data };
}

const op: Operation = {
  id: 'op1', kind: 'cluster.up', target: 'cluster:demo', state: 'running', reason: null,
  cancel_requested: false, created_at: 1000, finished_at: null
};

describe('OperationTracker', () => {
  it('applies each event once and follows the fraction', () => {
    const t = new OperationTracker();
    t.addOperation(op);
    expect(t.apply(ev(1, 'start', 'cluster.up cluster:demo', 0))).not.toBeNull();
    expect(t.apply(ev(2, 'workers', '0/2 workers connected', 0.5))!.fraction).toBe(0.5);
    expect(t.apply(ev(2, 'workers', '0/2 workers connected', 0.5))).toBeNull();
    expect(t.apply(ev(1, 'start', 'again', 0))).toBeNull();
    const row = t.apply(ev(3, 'workers', '1/2 workers connected', 0.72))!;
    expect(row.message).toBe('1/2 workers connected');
    expect(t.forCluster('demo').map(r => r.id)).toEqual(['op1']);
  });

  it('knows operations started elsewhere from their first event', () => {
    const t = new OperationTracker();
    // the start event says what in its data (the message is for people)
    const row = t.apply(ev(10, 'start', 'cluster.scale cluster:other', 0, 'op2', {
      kind: 'cluster.scale', resource: { kind: 'cluster', name: 'other' } }))!;
    expect(row.kind).toBe('cluster.scale');
    expect(row.cluster).toBe('other');
    expect(t.needsDetails(row)).toBe(false);
    const blind = t.apply(ev(11, 'workers', 'x', 0.4, 'op3'))!;
    expect(t.needsDetails(blind)).toBe(true);
  });

  it('reads the structured resource, and the target string of older servers', () => {
    const t = new OperationTracker();
    const row = t.addOperation({ ...op, id: 'op7', target: 'cluster:a:b',
                                 resource: { kind: 'cluster', name: 'a:b' } });
    expect(row.cluster).toBe('a:b');
    expect(t.addOperation({ ...op, id: 'op8', target: 'cluster:old' }).cluster).toBe('old');
  });

  it('ends with the final step and keeps failures visible longer', () => {
    const t = new OperationTracker();
    t.addOperation(op);
    t.apply(ev(5, 'failed', 'not enough capacity'));
    const row = t.rows.get('op1')!;
    expect(row.state).toBe('failed');
    expect(row.error).toBe('not enough capacity');
    expect(t.active()).toEqual([]);
    expect(t.visible(1005 + 10)).toHaveLength(1);
    expect(t.visible(1005 + 1000)).toHaveLength(0);
    // a later record of the same operation does not make it running again
    t.addOperation({ ...op, state: 'running' });
    expect(t.rows.get('op1')!.state).toBe('failed');
  });
});
