import { describe, expect, it } from 'vitest';

import { usageLines } from '../src/usage';

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
