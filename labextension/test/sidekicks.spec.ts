import { afterEach, describe, expect, it } from 'vitest';

import { ApiError, CloudTikApi } from '../src/model';
import {
  canStart,
  canStop,
  healthText,
  openUrl,
  Sidekick,
  sidekickBadge,
  SidekicksModel
} from '../src/sidekicks';

function sidekick(name: string, state: string, extra: Partial<Sidekick> = {}): Sidekick {
  return {
    name,
    description: `${name} service`,
    state,
    instance:
      state === 'stopped'
        ? null
        : {
            user: 'alice',
            name,
            state,
            prefix: `/services/cloudtik/sidekicks/alice/${name}`,
            pid: 42,
            port: 5000,
            restarts: 0,
            last_health: { time: 100, ok: true, detail: 'HTTP 200' },
            started_at: 90,
            reason: null,
            url: `/services/cloudtik/sidekicks/alice/${name}/`
          },
    ...extra
  };
}

/** A stand-in server: answers from a table (a function computes the answer). */
function api(answers: Record<string, unknown>): CloudTikApi & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    async request(path: string, init: { method?: string; body?: unknown } = {}) {
      const key = `${init.method ?? 'GET'} ${path}`;
      calls.push(key);
      let answer = answers[key];
      if (typeof answer === 'function') {
        answer = await answer();
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

const WHOAMI = { name: 'alice', groups: ['physics'], admin: false, quota: {} };
const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

let model: SidekicksModel | null = null;
afterEach(() => model?.stop());

describe('SidekicksModel', () => {
  it('stays hidden and asks nothing more when whoami is 404 (no hub)', async () => {
    const server = api({
      'GET hub/whoami': new ApiError('Not Found', 404)
    });
    model = new SidekicksModel(server, 0.05);
    let changes = 0;
    model.onChange(() => (changes += 1));
    await model.start();
    const unwatch = model.watch();
    await sleep(150);
    unwatch();
    expect(model.enabled).toBe(false);
    expect(changes).toBe(1);
    expect(server.calls).toEqual(['GET hub/whoami']);
    await model.refresh(true);
    expect(server.calls).toEqual(['GET hub/whoami']);
  });

  it('asks whoami again later when the hub did not answer (not a 404)', async () => {
    let whoami: unknown = new ApiError("the hub's cloudtik sidekick did not answer", 502);
    const server = api({
      'GET hub/whoami': () => whoami,
      'GET hub/sidekicks': { sidekicks: [] }
    });
    model = new SidekicksModel(server, 10, 0.05);
    await model.start();
    expect(model.enabled).toBeNull();
    whoami = WHOAMI;
    await sleep(120);
    expect(model.enabled).toBe(true);
    expect(model.whoami?.name).toBe('alice');
    expect(server.calls).toContain('GET hub/sidekicks');
  });

  it('lists side-kicks and polls only while watched and shown', async () => {
    const server = api({
      'GET hub/whoami': WHOAMI,
      'GET hub/sidekicks': { sidekicks: [sidekick('jobgw', 'stopped')] }
    });
    model = new SidekicksModel(server, 0.05);
    await model.start();
    expect(model.enabled).toBe(true);
    expect(model.sidekicks.map(s => s.name)).toEqual(['jobgw']);
    const count = () => server.calls.filter(c => c === 'GET hub/sidekicks').length;

    await sleep(150);
    expect(count()).toBe(1); // nobody watches: no polling

    const unwatch = model.watch();
    await sleep(200);
    const watched = count();
    expect(watched).toBeGreaterThanOrEqual(3);

    model.isShown = () => false;
    await sleep(150);
    expect(count()).toBe(watched); // the panel is hidden: no polling
    model.isShown = () => true;

    unwatch();
    unwatch(); // twice is harmless
    const after = count();
    await sleep(150);
    expect(count()).toBe(after);
  });

  it('keeps a failed listing as text and clears it on the next good answer', async () => {
    let answer: unknown = new ApiError('the server answered HTTP 500', 500);
    const server = api({ 'GET hub/whoami': WHOAMI, 'GET hub/sidekicks': () => answer });
    model = new SidekicksModel(server, 10);
    await model.start();
    expect(model.listError).toContain('HTTP 500');
    expect(model.sidekicks).toEqual([]);
    answer = { sidekicks: [sidekick('jobgw', 'running')] };
    await model.refresh(true);
    expect(model.listError).toBeNull();
    expect(model.sidekicks[0].state).toBe('running');
  });

  it('starts: shows "starting" while the request runs, then the list again', async () => {
    let state = 'stopped';
    let release: () => void = () => undefined;
    const server = api({
      'GET hub/whoami': WHOAMI,
      'GET hub/sidekicks': () => ({ sidekicks: [sidekick('jobgw', state)] }),
      'POST hub/sidekicks/jobgw': () =>
        new Promise(resolve => {
          release = () => {
            state = 'running';
            resolve(sidekick('jobgw', 'running').instance);
          };
        })
    });
    model = new SidekicksModel(server, 10);
    await model.start();
    const s = model.sidekicks[0];
    expect(canStart(model.stateOf(s))).toBe(true);
    const starting = model.startSidekick('jobgw');
    await sleep(10);
    expect(model.stateOf(model.sidekicks[0])).toBe('starting');
    // a second click while it starts asks nothing more
    await model.startSidekick('jobgw');
    expect(server.calls.filter(c => c.startsWith('POST')).length).toBe(1);
    release();
    await starting;
    const after = model.sidekicks[0];
    expect(model.stateOf(after)).toBe('running');
    expect(openUrl(after)).toBe('/services/cloudtik/sidekicks/alice/jobgw/');
    expect(server.calls.slice(-2)).toEqual(['POST hub/sidekicks/jobgw', 'GET hub/sidekicks']);
  });

  it('shows a refused start as text with the server message and never throws', async () => {
    const server = api({
      'GET hub/whoami': WHOAMI,
      'GET hub/sidekicks': { sidekicks: [sidekick('jobgw', 'stopped')] },
      'POST hub/sidekicks/jobgw': new ApiError(
        "quota: side-kicks 1 of 1 in use; stop 'other' first",
        409,
        'conflict',
        'sidekicks'
      )
    });
    model = new SidekicksModel(server, 10);
    await model.start();
    await model.startSidekick('jobgw');
    expect(model.error).toBe(
      "Starting side-kick 'jobgw' failed: quota: side-kicks 1 of 1 in use; stop 'other' first"
    );
    expect(model.pending.size).toBe(0);
    model.setError(null);
    expect(model.error).toBeNull();
  });

  it('stops with DELETE', async () => {
    let state = 'running';
    const server = api({
      'GET hub/whoami': WHOAMI,
      'GET hub/sidekicks': () => ({ sidekicks: [sidekick('jobgw', state)] }),
      'DELETE hub/sidekicks/jobgw': () => {
        state = 'stopped';
        return { name: 'jobgw', state: 'stopped' };
      }
    });
    model = new SidekicksModel(server, 10);
    await model.start();
    await model.stopSidekick('jobgw');
    expect(model.stateOf(model.sidekicks[0])).toBe('stopped');
    expect(openUrl(model.sidekicks[0])).toBeNull();
  });

  it('keeps only the answer to the latest listing', async () => {
    const answers: Array<(v: unknown) => void> = [];
    const server = api({
      'GET hub/whoami': WHOAMI,
      'GET hub/sidekicks': () => new Promise(resolve => answers.push(resolve))
    });
    model = new SidekicksModel(server, 10);
    void model.start();
    await sleep(5);
    const second = model.refresh(true);
    await sleep(5);
    answers[1]({ sidekicks: [sidekick('jobgw', 'running')] });
    await second;
    answers[0]({ sidekicks: [sidekick('jobgw', 'stopped')] });
    await sleep(5);
    expect(model.sidekicks[0].state).toBe('running');
  });
});

describe('side-kick display helpers', () => {
  it('badges, buttons and health text', () => {
    expect(sidekickBadge('running')).toBe('ok');
    expect(sidekickBadge('starting')).toBe('busy');
    expect(sidekickBadge('restarting')).toBe('warn');
    expect(sidekickBadge('failed')).toBe('error');
    expect(sidekickBadge('stopped')).toBe('off');
    expect(canStart('failed') && canStart('stopped')).toBe(true);
    expect(canStart('running')).toBe(false);
    expect(canStop('restarting') && canStop('running') && canStop('starting')).toBe(true);
    expect(canStop('stopped')).toBe(false);
    expect(healthText(null, 10)).toBe('not checked yet');
    expect(healthText({ time: 100, ok: true, detail: 'HTTP 200' }, 104.2)).toBe(
      'healthy, 4s ago'
    );
    expect(healthText({ time: 100, ok: false, detail: 'no answer within 2s' }, 400)).toBe(
      'unhealthy: no answer within 2s, 5m ago'
    );
    expect(openUrl(sidekick('a', 'restarting'))).toBeNull();
  });
});
