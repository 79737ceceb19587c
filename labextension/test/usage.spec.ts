import { describe, expect, it } from 'vitest';

import { clock, jobBars, loadLines, spanLabel, timeTicks, usageLines } from '../src/usage';

const pts = (s: string) => s.split(' ').map(p => p.split(',').map(Number));

describe('usageLines', () => {
  it('draws workers as steps and cost so far rising with the price', () => {
    // 1 worker at 1/h for an hour, then 3 workers at 3/h for an hour
    const samples = [
      { at: 0, workers: 1, cost_per_hour: 1 },
      { at: 3600, workers: 3, cost_per_hour: 3 }
    ];
    const lines = usageLines(samples, 7200, 200, 36);
    expect(lines.topWorkers).toBe(3);
    expect(lines.costSoFar).toBeCloseTo(4);
    const w = pts(lines.workers);
    expect(w[0][0]).toBe(0);
    expect(w[w.length - 1][0]).toBe(200);
    expect(w[1][1]).toBe(w[0][1]); // a step: level until the change
    const c = pts(lines.cost);
    expect(c.map(p => p[0])).toEqual([0, 100, 200]);
    // cost starts at the bottom, is a quarter of the way up at the change, tops out
    expect(c[0][1]).toBe(34);
    expect(c[1][1]).toBeCloseTo(34 - 0.25 * 32, 1);
    expect(c[2][1]).toBe(2);
  });

  it('keeps a flat cost line when nothing is priced', () => {
    const lines = usageLines([{ at: 10, workers: 2, cost_per_hour: null }], 20, 200, 36);
    expect(lines.costSoFar).toBe(0);
    expect(new Set(pts(lines.cost).map(p => p[1]))).toEqual(new Set([34]));
  });
});

describe('loadLines', () => {
  it('draws CPU on 0..100 % and memory on 0..the largest limit, with gaps where unmeasured', () => {
    const GiB = 2 ** 30;
    const samples = [
      { at: 0, workers: 1, cost_per_hour: null, cpu: 0, memory: GiB, memory_limit: 4 * GiB },
      { at: 50, workers: 1, cost_per_hour: null, cpu: 100, memory: 2 * GiB, memory_limit: 4 * GiB },
      { at: 60, workers: 2, cost_per_hour: null, cpu: null, memory: null, memory_limit: null },
      { at: 80, workers: 2, cost_per_hour: null, cpu: 50, memory: 4 * GiB, memory_limit: 4 * GiB }
    ];
    const load = loadLines(samples, 100, 100, 36);
    expect(load.measured).toBe(3);
    expect(load.memoryTop).toBe(4 * GiB);
    expect(load.lastCpu).toBe(50);
    expect(load.lastMemory).toBe(4 * GiB);
    // two runs: before the unmeasured sample and after it
    expect(load.cpu).toHaveLength(2);
    expect(load.memory).toHaveLength(2);
    const first = pts(load.cpu[0]);
    expect(first.map(p => p[0])).toEqual([0, 50]);
    expect(first[0][1]).toBe(34); // 0 % at the bottom
    expect(first[1][1]).toBe(2); // 100 % at the top
    const mem = pts(load.memory[0]);
    expect(mem[0][1]).toBe(34 - 0.25 * 32); // a quarter of the limit
    // a lone sample still shows: a short level line
    const lone = pts(load.cpu[1]);
    expect(lone).toEqual([
      [80, 18],
      [82, 18]
    ]);
  });

  it('has nothing to draw when no sample carries a load', () => {
    const load = loadLines([{ at: 0, workers: 1, cost_per_hour: null }], 10, 100, 36);
    expect(load.measured).toBe(0);
    expect(load.cpu).toEqual([]);
    expect(load.lastCpu).toBeNull();
  });

  it('scales memory to what is held when no limit is set', () => {
    const load = loadLines(
      [{ at: 0, workers: 1, cost_per_hour: null, cpu: 10, memory: 500, memory_limit: 0 }],
      10,
      100,
      36
    );
    expect(load.memoryTop).toBe(500);
  });
});

describe('timeTicks', () => {
  const fmt = (t: number) => `t${Math.round(t)}`;
  it('labels the start, the middle and the end', () => {
    expect(timeTicks(0, 600, 200, fmt)).toEqual([
      { pos: 0, label: 't0' },
      { pos: 100, label: 't300' },
      { pos: 200, label: 't600' }
    ]);
  });
  it('leaves out a middle that reads like an end', () => {
    expect(timeTicks(0, 30, 200, () => '18:30').map(t => t.pos)).toEqual([0, 200]);
  });
  it('shows times of day as HH:MM, with seconds over a short span', () => {
    expect(clock(0)).toMatch(/^\d\d:\d\d$/);
    expect(clock(0, true)).toMatch(/^\d\d:\d\d:00$/);
    expect(timeTicks(0, 120, 200)[0].label).toMatch(/^\d\d:\d\d:00$/);
    expect(timeTicks(0, 7200, 200)[0].label).toMatch(/^\d\d:\d\d$/);
  });
  it('says a span in words an axis can carry', () => {
    expect(spanLabel(45)).toBe('45 s');
    expect(spanLabel(720)).toBe('12 min');
    expect(spanLabel(3.5 * 3600)).toBe('3.5 h');
  });
});

describe('jobBars', () => {
  const job = (id: string, state: string, sub: number, start: number | null, end: number | null) => ({
    id,
    name: id,
    state,
    created_at: sub - 1,
    submitted_at: sub,
    started_at: start,
    finished_at: end
  });

  it('draws waiting and running from submitted, started and ended on one time axis', () => {
    const t = jobBars(
      [job('b', 'running', 100, 150, null), job('a', 'succeeded', 0, 50, 100), job('c', 'queued', 150, null, null)],
      200,
      200,
      12
    )!;
    expect([t.t0, t.t1]).toEqual([0, 200]); // a job still runs: until now
    expect(t.bars.map(b => [b.id, b.y])).toEqual([
      ['a', 0],
      ['b', 12],
      ['c', 24]
    ]); // oldest on top
    const [a, b, c] = t.bars;
    expect(a.wait).toEqual([0, 50]);
    expect(a.run).toEqual([50, 50]);
    expect(b.wait).toEqual([100, 50]);
    expect(b.run).toEqual([150, 50]); // until now
    expect(c.wait).toEqual([150, 50]);
    expect(c.run).toBeNull();
  });

  it('ends at the last end when every job has ended, and keeps a moment visible', () => {
    const t = jobBars([job('a', 'failed', 0, 10, 10), job('b', 'succeeded', 0, 0, 40)], 1000, 100, 12)!;
    expect(t.t1).toBe(40);
    expect(t.bars[0].run).toEqual([25, 1]); // failed at once: still one pixel
    expect(t.bars[1].wait).toBeNull(); // started as submitted
    expect(t.bars[1].run).toEqual([0, 100]);
  });

  it('shows the newest jobs only, and nothing without jobs', () => {
    const many = Array.from({ length: 12 }, (_, i) => job(`j${i}`, 'succeeded', i * 10, i * 10, i * 10 + 5));
    const t = jobBars(many, 500, 100, 12, 8)!;
    expect(t.bars.map(b => b.id)).toEqual(['j4', 'j5', 'j6', 'j7', 'j8', 'j9', 'j10', 'j11']);
    expect(jobBars([], 0, 100, 12)).toBeNull();
  });
});
