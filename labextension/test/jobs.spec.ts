import { afterEach, describe, expect, it } from 'vitest';

import { Job, jobBadge, JobsModel, jobRuntime } from '../src/jobs';
import { ApiError, CloudTikApi } from '../src/model';

function job(id: string, state: string, extra: Partial<Job> = {}): Job {
  return {
    id,
    name: `nb-${id}`,
    backend: 'local',
    backend_type: 'local',
    kind: 'notebook',
    state,
    native_id: id,
    native_state: null,
    reason: null,
    exit_code: null,
    error: null,
    op_id: `op-${id}`,
    output_notebook: 'nb.out.ipynb',
    created_at: 100,
    submitted_at: 100,
    started_at: 110,
    finished_at: null,
    ...extra
  };
}

/** A stand-in server: answers from a table (a function may compute the answer). */
function api(answers: Record<string, unknown>): CloudTikApi & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    async request(path: string, init: { method?: string; body?: unknown } = {}) {
      const key = `${init.method ?? 'GET'} ${path}`;
      calls.push(key);
      let answer = answers[key];
      if (typeof answer === 'function') {
        answer = answer();
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

describe('JobsModel', () => {
  it('lists jobs and refreshes when an event of a job operation arrives', async () => {
    let state = 'running';
    const server = api({
      'GET jobs?limit=50&sweep_elements=false': () => ({ jobs: [job('a1', state)] }),
      'GET jobs/sweeps?limit=20': { sweeps: [] }
    });
    model = new JobsModel(server);
    await model.start(60);
    expect(model.jobs.map(j => j.state)).toEqual(['running']);
    state = 'succeeded';
    model.handleEvent({ id: 9, op_id: 'op-a1', ts: 1, step: 'succeeded', message: 'done',
                        fraction: 1, level: 'info', data: {} });
    model.handleEvent({ id: 10, op_id: 'op-other', ts: 1, step: 'head', message: 'x',
                        fraction: null, level: 'info', data: {} });
    await new Promise(r => setTimeout(r, 300));
    expect(model.jobs[0].state).toBe('succeeded');
    expect(server.calls.filter(c => c === 'GET jobs?limit=50&sweep_elements=false')).toHaveLength(2);
  });

  it('tails the selected job log from the last offset until the job is done', async () => {
    const pieces = [
      { text: 'tick 0\n', offset: 7, eof: true, done: false },
      { text: 'tick 1\n', offset: 14, eof: true, done: false },
      { text: '', offset: 14, eof: true, done: true }
    ];
    let n = 0;
    const server = api({
      'GET jobs?limit=50&sweep_elements=false': { jobs: [job('b2', 'running')] },
      'GET jobs/sweeps?limit=20': { sweeps: [] },
      'GET jobs/b2/logs?offset=0': () => pieces[n++],
      'GET jobs/b2/logs?offset=7': () => pieces[n++],
      'GET jobs/b2/logs?offset=14': () => pieces[n++]
    });
    model = new JobsModel(server, 0.01);
    await model.start(60);
    model.select('b2');
    await new Promise(r => setTimeout(r, 150));
    expect(model.log).toBe('tick 0\ntick 1\n');
    expect(model.logOffset).toBe(14);
    expect(server.calls.filter(c => c.includes('/logs'))).toEqual([
      'GET jobs/b2/logs?offset=0', 'GET jobs/b2/logs?offset=7', 'GET jobs/b2/logs?offset=14'
    ]);
    model.select(null);
    expect(model.log).toBe('');
  });

  it('cancels, fetches the result, and keeps the server message of a refusal', async () => {
    const server = api({
      'GET jobs?limit=50&sweep_elements=false': { jobs: [job('c3', 'running')] },
      'GET jobs/sweeps?limit=20': { sweeps: [] },
      'DELETE jobs/c3': job('c3', 'running', { reason: 'cancelling' }),
      'POST jobs/c3/fetch': { dest: 'hpc-jobs/c3', output_notebook: 'hpc-jobs/c3/nb.out.ipynb' },
      'POST jobs/d4/fetch': new ApiError("job: no job 'd4'", 404, 'not_found', 'job')
    });
    model = new JobsModel(server);
    await model.start(60);
    await model.cancel('c3');
    expect(model.job('c3')?.reason).toBe('cancelling');
    expect(await model.fetchResult('c3')).toBe('hpc-jobs/c3/nb.out.ipynb');
    await expect(model.fetchResult('d4')).rejects.toThrow("no job 'd4'");
  });

  it('maps states to badges and computes runtimes', () => {
    expect(jobBadge('succeeded')).toBe('ok');
    expect(jobBadge('queued')).toBe('busy');
    expect(jobBadge('unknown')).toBe('warn');
    expect(jobBadge('failed')).toBe('error');
    expect(jobBadge('cancelled')).toBe('off');
    expect(jobRuntime(job('e', 'running'), 130)).toBe(20);
    expect(jobRuntime(job('e', 'succeeded', { finished_at: 115 }), 999)).toBe(5);
    expect(jobRuntime(job('e', 'queued', { started_at: null }), 999)).toBeNull();
  });
});
