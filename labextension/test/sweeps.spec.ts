import { afterEach, describe, expect, it } from 'vitest';

import { JobsModel } from '../src/jobs';
import { ApiError, CloudTikApi } from '../src/model';
import {
  formatValue,
  paramsLabel,
  progressSegments,
  resultColumns,
  Sweep,
  SweepCounts,
  sweepParameters,
  sweepSummary,
  sweepTimelineRow
} from '../src/sweeps';
import { jobBars, rowLabel } from '../src/usage';

function counts(c: Partial<SweepCounts>): SweepCounts {
  return { queued: 0, running: 0, succeeded: 0, failed: 0, cancelled: 0, unknown: 0, ...c };
}

function sweep(id: string, c: Partial<SweepCounts>, extra: Partial<Sweep> = {}): Sweep {
  const total = Object.values(counts(c)).reduce((a, b) => a + b, 0);
  return {
    id,
    name: `nb-${id}`,
    backend: 'local',
    mode: 'bounded',
    state: c.running ? 'running' : 'succeeded',
    max_concurrent: 2,
    notebook: 'nb.ipynb',
    counts: counts(c),
    elements: Array.from({ length: total }, (_, i) => ({
      index: i,
      job: `${id}-j${i}`,
      op_id: `op-${id}-${i}`,
      state: 'queued',
      native_id: null,
      native_state: null,
      parameters: { alpha: i / 10, n: 10 },
      reason: null,
      attempts: 1,
      started_at: null,
      finished_at: null
    })),
    created_at: 1,
    ...extra
  };
}

/** A stand-in server: answers from a table (a function may compute the answer). */
function api(answers: Record<string, unknown>): CloudTikApi & { calls: string[]; bodies: unknown[] } {
  const calls: string[] = [];
  const bodies: unknown[] = [];
  return {
    calls,
    bodies,
    async request(path: string, init: { method?: string; body?: unknown } = {}) {
      const key = `${init.method ?? 'GET'} ${path}`;
      calls.push(key);
      bodies.push(init.body);
      let answer = answers[key];
      if (typeof answer === 'function') {
        answer = answer(init.body);
      }
      if (answer instanceof ApiError) {
        throw answer;
      }
      if (answer === undefined) {
        throw new ApiError(`no answer for ${key}`, 404);
      }
      return answer as any;
    },
    fetcher: async () => new Response('', { status: 200 })
  };
}

let model: JobsModel | null = null;
afterEach(() => model?.stop());

describe('sweep progress geometry', () => {
  it('gives each state with elements a share of the bar, side by side to exactly 100', () => {
    const segs = progressSegments(counts({ succeeded: 1, failed: 1, running: 1 }));
    expect(segs.map(s => s.state)).toEqual(['succeeded', 'failed', 'running']);
    expect(segs.map(s => s.count)).toEqual([1, 1, 1]);
    expect(segs[0].x).toBe(0);
    for (let i = 1; i < segs.length; i++) {
      expect(segs[i].x).toBeCloseTo(segs[i - 1].x + segs[i - 1].width, 6);
    }
    const last = segs[segs.length - 1];
    expect(last.x + last.width).toBeCloseTo(100, 6);
    expect(segs[0].width).toBeCloseTo(33.33, 2);
  });

  it('leaves out states with no elements and draws nothing for an empty sweep', () => {
    expect(progressSegments(counts({}))).toEqual([]);
    const segs = progressSegments(counts({ queued: 97, succeeded: 3 }));
    expect(segs).toEqual([
      { state: 'succeeded', count: 3, x: 0, width: 3 },
      { state: 'queued', count: 97, x: 3, width: 97 }
    ]);
    expect(progressSegments(counts({ cancelled: 7 }))).toEqual([
      { state: 'cancelled', count: 7, x: 0, width: 100 }
    ]);
  });

  it('says the counts in words, the ones that are not 0', () => {
    expect(sweepSummary(counts({ succeeded: 3, failed: 1, running: 2 }))).toBe(
      '4/6 ended · 1 failed · 2 running'
    );
    expect(sweepSummary(counts({ queued: 5 }))).toBe('0/5 ended · 5 queued');
  });
});

describe('sweep results table', () => {
  it('orders columns: element, state, parameters, recorded values, outputs', () => {
    const rows = [
      { element: 0, job: 'j0', state: 'succeeded', alpha: 0.1, n: 10, score: 1, outputs: ['o'],
        crate: 'c', location: 'l', reason: null },
      { element: 1, job: 'j1', state: 'failed', alpha: 0.2, n: 10, loss: 2, outputs: [],
        crate: null, location: 'l', reason: 'boom', unread: 'too big' }
    ];
    expect(resultColumns(rows, ['alpha', 'n'])).toEqual([
      'element', 'state', 'alpha', 'n', 'score', 'loss', 'outputs'
    ]);
  });

  it('formats cells: numbers to 4 significant digits, lists joined, long text cut', () => {
    expect(formatValue(0.123456)).toBe('0.1235');
    expect(formatValue(12)).toBe('12');
    expect(formatValue(null)).toBe('');
    expect(formatValue(['a.csv', 'b.png'])).toBe('a.csv, b.png');
    expect(formatValue({ a: 1 })).toBe('{"a":1}');
    expect(formatValue('x'.repeat(100), 10)).toBe(`${'x'.repeat(9)}…`);
    expect(paramsLabel({ alpha: 0.1, n: 10, name: 'a' })).toBe('alpha=0.1, n=10, name=a');
  });

  it('takes the parameter names from the elements', () => {
    const s = sweep('s', { queued: 2 });
    s.elements[1].parameters = { alpha: 1, n: 2, extra: true };
    expect(sweepParameters(s)).toEqual(['alpha', 'n', 'extra']);
  });
});

describe('JobsModel with sweeps', () => {
  it('lists sweeps beside jobs and refreshes when an element job moves', async () => {
    let running = 2;
    const server = api({
      'GET jobs?limit=50&sweep_elements=false': { jobs: [] },
      'GET jobs/sweeps?limit=20': () => ({ sweeps: [sweep('s1', { running, succeeded: 2 - running })] })
    });
    model = new JobsModel(server);
    await model.start(60);
    expect(model.sweeps[0].counts.running).toBe(2);
    running = 0;
    model.handleEvent({ id: 1, op_id: 'op-s1-1', ts: 1, step: 'succeeded', message: 'done',
                        fraction: 1, level: 'info', data: {} });
    await new Promise(r => setTimeout(r, 300));
    expect(model.sweeps[0].counts.succeeded).toBe(2);
    const refreshes = server.calls.filter(c => c === 'GET jobs/sweeps?limit=20').length;
    model.handleEvent({ id: 2, op_id: 'op-unrelated', ts: 1, step: 'head', message: 'x',
                        fraction: null, level: 'info', data: {} });
    await new Promise(r => setTimeout(r, 300));
    expect(server.calls.filter(c => c === 'GET jobs/sweeps?limit=20')).toHaveLength(refreshes);
  });

  it('cancels the sweep or one element, retries the failed, reads and hides results', async () => {
    const server = api({
      'GET jobs?limit=50&sweep_elements=false': { jobs: [] },
      'GET jobs/sweeps?limit=20': { sweeps: [sweep('s2', { running: 2 })] },
      'POST jobs/sweeps/s2/cancel': (body: { element?: number }) =>
        sweep('s2', body.element === undefined ? { cancelled: 2 } : { cancelled: 1, running: 1 },
              { state: body.element === undefined ? 'cancelled' : 'running' }),
      'POST jobs/sweeps/s2/retry': sweep('s2', { queued: 2 }, { state: 'queued' }),
      'GET jobs/sweeps/s2/results': { sweep: 's2', rows: [{ element: 0, state: 'cancelled' }] },
      'POST jobs/sweeps/s3/retry': new ApiError("sweep: no sweep 's3'", 404, 'not_found', 'sweep')
    });
    model = new JobsModel(server);
    await model.start(60);
    await model.cancelSweep('s2', 1);
    expect(server.bodies[server.calls.indexOf('POST jobs/sweeps/s2/cancel')]).toEqual({ element: 1 });
    expect(model.sweep('s2')?.counts.cancelled).toBe(1);
    await model.cancelSweep('s2');
    expect(model.sweep('s2')?.state).toBe('cancelled');
    await model.retrySweep('s2');
    expect(model.sweep('s2')?.counts.queued).toBe(2);
    await model.loadResults('s2');
    expect(model.results.get('s2')).toEqual([{ element: 0, state: 'cancelled' }]);
    model.hideResults('s2');
    expect(model.results.has('s2')).toBe(false);
    await expect(model.retrySweep('s3')).rejects.toThrow("no sweep 's3'");
    model.toggleSweep('s2');
    expect(model.expanded.has('s2')).toBe(true);
    model.toggleSweep('s2');
    expect(model.expanded.has('s2')).toBe(false);
  });
});

describe('a sweep in the jobs timeline', () => {
  const timed = (s: Sweep, times: [number | null, number | null][]): Sweep => ({
    ...s,
    created_at: 100,
    elements: s.elements.map((e, i) => ({ ...e, started_at: times[i][0], finished_at: times[i][1] }))
  });

  it('is one row from its creation to its last element, with its counts', () => {
    const s = timed(sweep('s1', { succeeded: 2, failed: 1 }, { state: 'failed', name: 'scan' }), [
      [110, 130],
      [120, 160],
      [null, 105] // refused at once: never started
    ]);
    const row = sweepTimelineRow(s);
    expect([row.submitted_at, row.started_at, row.finished_at]).toEqual([100, 110, 160]);
    expect(row.sweepRow).toEqual({ total: 3, ended: 3, summary: '3/3 ended · 1 failed' });
    const t = jobBars([row, { ...row, id: 'j', name: 'job', sweepRow: undefined, created_at: 90, submitted_at: 90 }], 500, 70, 12)!;
    expect(t.bars.map(b => b.id)).toEqual(['j', 's1']); // one row for the sweep's three elements
    const bar = t.bars[1];
    expect(bar.wait).toEqual([10, 10]); // created at 100 (x 10), first element started at 110
    expect(bar.run).toEqual([20, 50]); // until its last element ended, at 160
    expect(rowLabel(bar)).toBe('scan 3/3');
    expect(rowLabel(t.bars[0])).toBe('job');
  });

  it('runs until now while active, and shortens a long name before its count', () => {
    const s = timed(sweep('s2', { running: 1, queued: 1 }, { name: 'a-very-long-sweep-name' }), [
      [105, null],
      [null, null]
    ]);
    const row = sweepTimelineRow(s);
    expect([row.started_at, row.finished_at]).toEqual([105, null]);
    expect(row.sweepRow!.summary).toBe('0/2 ended · 1 running · 1 queued');
    expect(rowLabel({ name: row.name, sweepRow: row.sweepRow })).toBe('a-very-… 0/2');
    expect(rowLabel({ name: 'x', sweepRow: { total: 100000, ended: 99999, summary: '' } })).toBe('99999/100000');
  });
});
