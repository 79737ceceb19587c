/** Geometry of the panel's charts, pure so the shapes are unit-tested without a browser:
 * a cluster's workers (a step line) and cost so far (a rising line on its own axis), its
 * workers' CPU and memory use over its life (from the server's samples), the labelled
 * axes of both (times at the bottom, units on the sides), and the jobs timeline (a bar
 * per HPC job from submitted to started to ended). */

export interface UsageSample {
  at: number;
  workers: number;
  cost_per_hour: number | null;
  /** percent of the workers' threads, null where not measured */
  cpu?: number | null;
  /** bytes the workers' processes hold */
  memory?: number | null;
  /** sum of the workers' memory limits (0: none set) */
  memory_limit?: number | null;
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

/** The chart's time span: the first sample until now (at least one second). */
export function span(samples: { at: number }[], now: number): [number, number] {
  const t0 = samples[0].at;
  return [t0, Math.max(now, t0 + 1)];
}

function xOf(t0: number, t1: number, w: number): (t: number) => string {
  return (t: number) => (((Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0)) * w).toFixed(1);
}

/** y of a value on an axis 0..top in a plot `h` high (1 px kept free above and below). */
function yOf(top: number, h: number): (v: number) => string {
  return (v: number) => (h - 2 - (Math.min(v, top) / top) * (h - 4)).toFixed(1);
}

export function usageLines(samples: UsageSample[], now: number, w: number, h: number): UsageLines {
  const [t0, t1] = span(samples, now);
  const topWorkers = Math.max(1, ...samples.map(s => s.workers));
  const x = xOf(t0, t1, w);
  const yw = yOf(topWorkers, h);
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
  const yc = yOf(top, h);
  const cost = accrued.map(([t, c]) => `${x(t)},${yc(c)}`).join(' ');
  return { workers: workers.join(' '), cost, topWorkers, costSoFar: total };
}

export interface LoadLines {
  /** Polylines (one per run of measured samples: a gap where none was measured) of the
   * workers' CPU use on an axis 0..100 %. */
  cpu: string[];
  /** The same for the memory they hold, on an axis 0..memoryTop bytes. */
  memory: string[];
  /** The memory axis' top: the largest memory limit, or the most held when no limit is set. */
  memoryTop: number;
  /** Samples with a load (0: no chart to draw). */
  measured: number;
  /** The last measured figures. */
  lastCpu: number | null;
  lastMemory: number | null;
}

export function loadLines(samples: UsageSample[], now: number, w: number, h: number): LoadLines {
  const [t0, t1] = span(samples, now);
  const x = xOf(t0, t1, w);
  const measured = samples.filter(
    s => s.cpu !== null && s.cpu !== undefined && s.memory !== null && s.memory !== undefined
  );
  const memoryTop = Math.max(1, ...measured.map(s => Math.max(s.memory_limit ?? 0, s.memory ?? 0)));
  const ycpu = yOf(100, h);
  const ymem = yOf(memoryTop, h);
  const cpu: string[] = [];
  const memory: string[] = [];
  let run: UsageSample[] = [];
  const line = (y: (v: number) => string, value: (s: UsageSample) => number): string => {
    const points = run.map(s => `${x(s.at)},${y(value(s))}`);
    if (run.length === 1) {
      // a lone sample is drawn as a short level line so it shows
      const x1 = Math.min(Number(x(run[0].at)) + 2, w).toFixed(1);
      points.push(`${x1},${y(value(run[0]))}`);
    }
    return points.join(' ');
  };
  const close = () => {
    if (run.length) {
      cpu.push(line(ycpu, s => s.cpu as number));
      memory.push(line(ymem, s => s.memory as number));
    }
    run = [];
  };
  for (const s of samples) {
    if (s.cpu === null || s.cpu === undefined || s.memory === null || s.memory === undefined) {
      close();
    } else {
      run.push(s);
    }
  }
  close();
  const last = measured[measured.length - 1];
  return {
    cpu,
    memory,
    memoryTop,
    measured: measured.length,
    lastCpu: last ? (last.cpu as number) : null,
    lastMemory: last ? (last.memory as number) : null
  };
}

export interface Tick {
  /** where on the axis (px from its start) */
  pos: number;
  label: string;
}

/** A time of day as the chart's axis shows it: HH:MM (HH:MM:SS with `seconds`) in the
 * browser's time zone. */
export function clock(t: number, seconds = false): string {
  const d = new Date(t * 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  const hm = `${two(d.getHours())}:${two(d.getMinutes())}`;
  return seconds ? `${hm}:${two(d.getSeconds())}` : hm;
}

/** Ticks of a time axis `w` wide from t0 to t1: its start, middle and end, as times of day
 * (with seconds when the span is under 10 minutes; a middle tick is left out when it would
 * read the same as an end). */
export function timeTicks(
  t0: number,
  t1: number,
  w: number,
  fmt: (t: number) => string = t => clock(t, t1 - t0 < 600)
): Tick[] {
  const ends: Tick[] = [
    { pos: 0, label: fmt(t0) },
    { pos: w, label: fmt(t1) }
  ];
  const mid = { pos: w / 2, label: fmt((t0 + t1) / 2) };
  if (mid.label === ends[0].label || mid.label === ends[1].label) {
    return ends;
  }
  return [ends[0], mid, ends[1]];
}

/** The length of a time span in words an axis can carry ("45 s", "12 min", "3.5 h"). */
export function spanLabel(seconds: number): string {
  if (seconds < 90) {
    return `${Math.round(seconds)} s`;
  }
  if (seconds < 5400) {
    return `${Math.round(seconds / 60)} min`;
  }
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** A sweep drawn as one row: how many elements it has, how many ended, and its counts in
 * words (the row's tooltip). */
export interface SweepRow {
  total: number;
  ended: number;
  summary: string;
}

export interface TimelineJob {
  id: string;
  name: string;
  state: string;
  created_at: number;
  submitted_at: number | null;
  started_at: number | null;
  finished_at: number | null;
  /** set when the row is a whole sweep (sweeps.ts: sweepTimelineRow); a job's own `sweep`
   * field names the sweep it belongs to */
  sweepRow?: SweepRow;
}

export interface JobBar {
  id: string;
  name: string;
  state: string;
  sweepRow?: SweepRow;
  /** top of the job's row */
  y: number;
  /** waiting (submitted, not started): x and width, or null */
  wait: [number, number] | null;
  /** running (started until ended, or until now): x and width, or null */
  run: [number, number] | null;
}

export interface Timeline {
  t0: number;
  t1: number;
  bars: JobBar[];
}

/** The jobs timeline: one row per job (the newest `max`, oldest on top), a pale bar while
 * it waited (submitted → started, or → ended when it never started) and a full one while
 * it ran (started → ended, or → now), across the time from the first submission to now
 * (or the last end when every job has ended). */
export function jobBars(
  jobs: TimelineJob[],
  now: number,
  w: number,
  rowH: number,
  max = 8
): Timeline | null {
  const shown = [...jobs]
    .sort((a, b) => (a.submitted_at ?? a.created_at) - (b.submitted_at ?? b.created_at))
    .slice(-max);
  if (shown.length === 0) {
    return null;
  }
  const begin = (j: TimelineJob) => j.submitted_at ?? j.created_at;
  const t0 = Math.min(...shown.map(begin));
  const open = shown.some(j => j.finished_at === null);
  const t1 = Math.max(t0 + 1, open ? now : Math.max(...shown.map(j => j.finished_at ?? now)));
  const x = (t: number) => ((Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0)) * w;
  const seg = (a: number, b: number): [number, number] => {
    const xa = x(a);
    // a job of a moment still shows: at least one pixel wide
    return [Number(xa.toFixed(1)), Number(Math.max(x(b) - xa, 1).toFixed(1))];
  };
  const bars = shown.map((j, i) => {
    const end = j.finished_at ?? now;
    const waitEnd = j.started_at ?? end;
    return {
      id: j.id,
      name: j.name,
      state: j.state,
      ...(j.sweepRow ? { sweepRow: j.sweepRow } : {}),
      y: i * rowH,
      wait: waitEnd > begin(j) || j.started_at === null ? seg(begin(j), waitEnd) : null,
      run: j.started_at !== null ? seg(j.started_at, end) : null
    };
  });
  return { t0, t1, bars };
}

/** A row's label in the timeline's name column, at most `max` characters: the job's name;
 * a sweep's name and its ended/total count ("scan 4/10"), the name shortened first. */
export function rowLabel(bar: { name: string; sweepRow?: SweepRow }, max = 12): string {
  const cut = (text: string, n: number) =>
    text.length > n ? `${text.slice(0, Math.max(n - 1, 0))}…` : text;
  if (!bar.sweepRow) {
    return cut(bar.name, max);
  }
  const count = `${bar.sweepRow.ended}/${bar.sweepRow.total}`;
  const room = max - count.length - 1;
  return room >= 2 ? `${cut(bar.name, room)} ${count}` : count;
}
