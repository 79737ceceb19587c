/** The panel's charts (SVG, geometry in ../usage.ts): a cluster's workers and cost so far,
 * its workers' CPU and memory use, and the jobs timeline.  Every axis is labelled: times of
 * day along the bottom, each line's unit and range on its side. */

import * as React from 'react';

import { formatBytes } from '../format';
import { jobBadge } from '../jobs';
import { Usage } from '../model';
import { jobBars, loadLines, rowLabel, span, spanLabel, Tick, timeTicks, TimelineJob, usageLines } from '../usage';

/** Room around a chart's plot: titles above, the left and right axes' labels, times below. */
const M = { left: 34, right: 44, top: 11, bottom: 12 };
const W = 250;
const H = 36;
const PLOT = W - M.left - M.right;

function TimeAxis(props: { ticks: Tick[]; x: number; y: number; seconds: number }): JSX.Element {
  const last = props.ticks.length - 1;
  return (
    <g className="jp-CloudTik-timeAxis" transform={`translate(${props.x},${props.y})`}>
      <line x1={0} x2={props.ticks[last].pos} y1={0} y2={0} className="jp-CloudTik-axisLine" />
      {props.ticks.map((t, i) => (
        <text
          key={i}
          className="jp-CloudTik-axisLabel jp-CloudTik-timeLabel"
          x={t.pos}
          y={9}
          textAnchor={i === 0 ? 'start' : i === last ? 'end' : 'middle'}
        >
          {t.label}
        </text>
      ))}
      <title>{`time of day (the last ${spanLabel(props.seconds)})`}</title>
    </g>
  );
}

/** A value axis: its title above the plot, its top and 0 beside it (left or right). */
function ValueAxis(props: { side: 'left' | 'right'; title: string; top: string; bottom?: string }): JSX.Element {
  const left = props.side === 'left';
  const x = left ? M.left - 3 : M.left + PLOT + 3;
  const anchor = left ? 'end' : 'start';
  return (
    <g className={`jp-CloudTik-valueAxis jp-mod-${props.side}`}>
      <text className="jp-CloudTik-axisTitle" x={left ? 0 : W} y={7} textAnchor={left ? 'start' : 'end'}>
        {props.title}
      </text>
      <text className="jp-CloudTik-axisLabel" x={x} y={M.top + 6} textAnchor={anchor}>
        {props.top}
      </text>
      <text className="jp-CloudTik-axisLabel" x={x} y={M.top + H - 1} textAnchor={anchor}>
        {props.bottom ?? '0'}
      </text>
    </g>
  );
}

function Frame(props: { className: string; label: string; children: React.ReactNode; data?: Record<string, string | number> }): JSX.Element {
  return (
    <svg
      className={`jp-CloudTik-usageChart ${props.className}`}
      width={W}
      height={M.top + H + M.bottom}
      viewBox={`0 0 ${W} ${M.top + H + M.bottom}`}
      role="img"
      aria-label={props.label}
      {...Object.fromEntries(Object.entries(props.data ?? {}).map(([k, v]) => [`data-${k}`, v]))}
    >
      <rect className="jp-CloudTik-plotArea" x={M.left} y={M.top} width={PLOT} height={H} />
      {props.children}
    </svg>
  );
}

/** Workers and cost so far, then the workers' CPU and memory (when measured). */
export function UsageCharts(props: { usage: Usage; now: number }): JSX.Element {
  const { usage, now } = props;
  const [t0, t1] = span(usage.samples, now);
  const ticks = timeTicks(t0, t1, PLOT);
  const lines = usageLines(usage.samples, now, PLOT, H);
  const load = loadLines(usage.samples, now, PLOT, H);
  const unit = usage.currency ? ` ${usage.currency}` : '';
  const inPlot = `translate(${M.left},${M.top})`;
  return (
    <div className="jp-CloudTik-usage" data-samples={usage.samples.length}>
      <Frame
        className="jp-CloudTik-workersChart"
        label={`workers over time (axis 0 to ${lines.topWorkers}) and cost so far (dashed, axis 0 to ${lines.costSoFar.toFixed(3)}${unit})`}
      >
        <ValueAxis side="left" title="workers" top={String(lines.topWorkers)} />
        <ValueAxis side="right" title={`cost so far${unit}`} top={lines.costSoFar.toFixed(lines.costSoFar >= 10 ? 1 : 3)} />
        <g transform={inPlot}>
          <polyline className="jp-CloudTik-workersLine" points={lines.workers} fill="none" stroke="var(--jp-brand-color1)" strokeWidth={1.5}>
            <title>{`workers (axis 0..${lines.topWorkers})`}</title>
          </polyline>
          <polyline className="jp-CloudTik-costLine" points={lines.cost} fill="none" stroke="var(--jp-warn-color1)" strokeWidth={1.2} strokeDasharray="3 2">
            <title>{`cost so far (axis 0..${lines.costSoFar.toFixed(3)}${unit})`}</title>
          </polyline>
        </g>
        <TimeAxis ticks={ticks} x={M.left} y={M.top + H} seconds={t1 - t0} />
      </Frame>
      {load.measured > 0 && (
        <Frame
          className="jp-CloudTik-loadChart"
          label={`workers' CPU use (axis 0 to 100 %) and memory (dashed, axis 0 to ${formatBytes(load.memoryTop)}) over time`}
          data={{ measured: load.measured }}
        >
          <ValueAxis side="left" title="CPU %" top="100" />
          <ValueAxis side="right" title="memory" top={formatBytes(load.memoryTop)} />
          <g transform={inPlot}>
            {load.cpu.map((points, i) => (
              <polyline key={`c${i}`} className="jp-CloudTik-cpuLine" points={points} fill="none" stroke="var(--jp-success-color1)" strokeWidth={1.5}>
                <title>CPU use, percent of the workers' threads</title>
              </polyline>
            ))}
            {load.memory.map((points, i) => (
              <polyline key={`m${i}`} className="jp-CloudTik-memoryLine" points={points} fill="none" stroke="var(--jp-info-color1, #7b1fa2)" strokeWidth={1.2} strokeDasharray="3 2">
                <title>{`memory held by the workers (axis 0..${formatBytes(load.memoryTop)})`}</title>
              </polyline>
            ))}
          </g>
          <TimeAxis ticks={ticks} x={M.left} y={M.top + H} seconds={t1 - t0} />
        </Frame>
      )}
      <span className="jp-CloudTik-usageLegend">
        <span className="jp-CloudTik-legendWorkers">— workers</span>{' '}
        <span className="jp-CloudTik-legendCost">┄ cost:</span>
      </span>{' '}
      <span className="jp-CloudTik-cost" title="cost so far (estimated from the offers' prices)">
        {`${usage.cost_so_far.toFixed(3)}${unit} so far`}
        {usage.cost_per_hour !== null ? `, ${usage.cost_per_hour.toFixed(3)}${unit}/h` : ''}
      </span>
      {load.measured > 0 && (
        <span className="jp-CloudTik-loadLegend" title="the workers' load at the last sample">
          {' '}
          <span className="jp-CloudTik-legendCpu">— CPU {load.lastCpu?.toFixed(0)}%</span>{' '}
          <span className="jp-CloudTik-legendMemory">┄ memory {formatBytes(load.lastMemory)}</span>
        </span>
      )}
    </div>
  );
}

const ROW = 12;
const NAMES = 64;

/** The jobs as bars in time: pale while waiting (submitted → started), coloured by state
 * while running and after (started → ended), the newest 8. */
export function JobsTimeline(props: { jobs: TimelineJob[]; now: number }): JSX.Element | null {
  const plot = W - NAMES - 6;
  const timeline = jobBars(props.jobs, props.now, plot, ROW);
  if (!timeline) {
    return null;
  }
  const height = timeline.bars.length * ROW;
  const ticks = timeTicks(timeline.t0, timeline.t1, plot);
  return (
    <svg
      className="jp-CloudTik-jobsTimeline"
      width={W}
      height={M.top + height + M.bottom}
      viewBox={`0 0 ${W} ${M.top + height + M.bottom}`}
      role="img"
      aria-label="jobs timeline: a bar per job (a sweep is one row, with its ended/total count) from submitted to started (pale) to ended, coloured by state"
      data-bars={timeline.bars.length}
    >
      <text className="jp-CloudTik-axisTitle" x={0} y={7}>
        job
      </text>
      <text className="jp-CloudTik-axisTitle" x={W} y={7} textAnchor="end">
        waiting ░ running/ended █
      </text>
      {timeline.bars.map(b => (
        <g
          key={b.id}
          className={`jp-CloudTik-jobRow${b.sweepRow ? ' jp-CloudTik-sweepRow' : ''}`}
          {...(b.sweepRow ? { 'data-sweep-id': b.id } : { 'data-job-id': b.id })}
          data-state={b.state}
          transform={`translate(0,${M.top + b.y})`}
        >
          <text className="jp-CloudTik-axisLabel jp-CloudTik-jobLabel" x={NAMES - 3} y={ROW - 3} textAnchor="end">
            {rowLabel(b)}
          </text>
          {b.wait && <rect className="jp-CloudTik-jobWait" x={NAMES + b.wait[0]} y={2} width={b.wait[1]} height={ROW - 4} />}
          {b.run && (
            <rect
              className={`jp-CloudTik-jobBar jp-mod-${jobBadge(b.state)}`}
              data-state={b.state}
              x={NAMES + b.run[0]}
              y={1}
              width={b.run[1]}
              height={ROW - 2}
            />
          )}
          <title>
            {b.sweepRow ? `${b.name} (sweep of ${b.sweepRow.total}): ${b.state}, ${b.sweepRow.summary}` : `${b.name}: ${b.state}`}
          </title>
        </g>
      ))}
      <TimeAxis ticks={ticks} x={NAMES} y={M.top + height} seconds={timeline.t1 - timeline.t0} />
    </svg>
  );
}
