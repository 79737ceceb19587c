/** Geometry of the panel's usage chart: workers (a step line) and cost so far (a rising
 * line on its own axis) over a cluster's life, from the server's samples.  Pure, so the
 * shapes are unit-tested without a browser. */

export interface UsageSample {
  at: number;
  workers: number;
  cost_per_hour: number | null;
}

export interface UsageLines {
  /** SVG polyline points of workers over time (a step line). */
  workers: string;
  /** SVG polyline points of the cost accrued so far (each sample's price holds until the next). */
  cost: string;
  /** The top of each axis: most workers, cost at the end. */
  topWorkers: number;
  costSoFar: number;
}

export function usageLines(samples: UsageSample[], now: number, w: number, h: number): UsageLines {
  const t0 = samples[0].at;
  const t1 = Math.max(now, t0 + 1);
  const topWorkers = Math.max(1, ...samples.map(s => s.workers));
  const x = (t: number) => (((Math.min(t, t1) - t0) / (t1 - t0)) * w).toFixed(1);
  const yw = (n: number) => (h - 2 - (n / topWorkers) * (h - 4)).toFixed(1);
  const workers: string[] = [];
  samples.forEach((s, i) => {
    if (i > 0) {
      workers.push(`${x(s.at)},${yw(samples[i - 1].workers)}`);
    }
    workers.push(`${x(s.at)},${yw(s.workers)}`);
  });
  workers.push(`${w},${yw(samples[samples.length - 1].workers)}`);
  // cost so far at each sample and at the end: the price integrated over time
  const accrued: [number, number][] = [[t0, 0]];
  let total = 0;
  samples.forEach((s, i) => {
    const until = i + 1 < samples.length ? samples[i + 1].at : t1;
    total += ((s.cost_per_hour ?? 0) * Math.max(until - s.at, 0)) / 3600;
    accrued.push([until, total]);
  });
  const top = total > 0 ? total : 1;
  const yc = (c: number) => (h - 2 - (c / top) * (h - 4)).toFixed(1);
  const cost = accrued.map(([t, c]) => `${x(t)},${yc(c)}`).join(' ');
  return { workers: workers.join(' '), cost, topWorkers, costSoFar: total };
}
