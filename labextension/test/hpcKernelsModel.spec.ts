import { afterEach, describe, expect, it } from 'vitest';

import {
  canShutDown,
  HpcKernelsModel,
  involved,
  ListedHpcKernel,
  offersHpcKernels,
  sortKernels
} from '../src/hpcKernelsModel';
import { ApiError, CloudTikApi } from '../src/model';

const base: ListedHpcKernel = { id: 'k1', backend: 'daint', profile: 'debug', state: 'running' };

/** A stand-in server: the list it answers can change between requests. */
function api(answer: () => unknown): CloudTikApi & { calls: number } {
  const stub = {
    calls: 0,
    async request(path: string) {
      stub.calls += 1;
      expect(path).toBe('hpc/kernels');
      const a = answer();
      if (a instanceof Error) {
        throw a;
      }
      return a as any;
    },
    fetcher: async () => new Response('', { status: 200 })
  };
  return stub;
}

let model: HpcKernelsModel | null = null;
afterEach(() => model?.dispose());

describe('the HPC kernels list', () => {
  it('puts live kernels first (submitting, queued, running), then the dead, newest first', () => {
    const dead = { ...base, id: 'd', state: 'dead', time: 9 };
    const orphan = { ...base, id: 'o', state: 'dead', orphaned: true, time: 10 };
    const queued = { ...base, id: 'q', state: 'queued', time: 1 };
    const running = { ...base, id: 'r', time: 2 };
    const sub = { ...base, id: 's', state: 'submitting', time: 0 };
    expect(sortKernels([orphan, dead, running, queued, sub]).map(k => k.id)).toEqual([
      's',
      'q',
      'r',
      'd',
      'o'
    ]);
  });
  it('polls fast only while a kernel waits, and offers shut down only for live ones', () => {
    expect(involved([{ ...base, state: 'queued' }])).toBe(true);
    expect(involved([base, { ...base, state: 'dead' }])).toBe(false);
    expect(canShutDown(base)).toBe(true);
    expect(canShutDown({ ...base, state: 'dead' })).toBe(false);
    expect(canShutDown({ ...base, state: 'running', orphaned: true })).toBe(false);
  });
  it('is there when the server has an HPC kernel spec or a kernel', async () => {
    expect(offersHpcKernels(['python3', 'cloudtik-hpc-daint-debug'])).toBe(true);
    expect(offersHpcKernels(['python3', 'cloudtik-hpcx'])).toBe(false);
    let specs = ['python3'];
    let kernels: ListedHpcKernel[] = [];
    model = new HpcKernelsModel(
      api(() => ({ kernels })),
      async () => undefined,
      () => specs
    );
    await model.refresh();
    expect(model.visible).toBe(false);
    specs = ['python3', 'cloudtik-hpc-daint-debug'];
    expect(model.visible).toBe(true);
    specs = [];
    kernels = [base];
    await model.refresh();
    expect(model.visible).toBe(true);
  });
  it('says why a listing failed, and a 404 (no HPC here) is an empty list, not an error', async () => {
    let answer: unknown = new ApiError('the server answered HTTP 500', 500);
    model = new HpcKernelsModel(
      api(() => answer),
      async () => undefined,
      () => []
    );
    await model.refresh();
    expect(model.error).toBe('Could not list the HPC kernels: the server answered HTTP 500');
    answer = new ApiError('Not Found', 404);
    await model.refresh();
    expect(model.error).toBeNull();
    expect(model.kernels).toEqual([]);
  });
  it('shuts a kernel down, shows it pending meanwhile, reads the list again, keeps a failure', async () => {
    let kernels: ListedHpcKernel[] = [base];
    const ended: string[] = [];
    let release: () => void = () => undefined;
    const stub = api(() => ({ kernels }));
    model = new HpcKernelsModel(
      stub,
      id =>
        new Promise<void>(resolve => {
          ended.push(id);
          release = () => {
            kernels = [];
            resolve();
          };
        }),
      () => []
    );
    await model.refresh();
    const done = model.shutdown('k1');
    expect(model.pending.has('k1')).toBe(true);
    release();
    await done;
    expect(ended).toEqual(['k1']);
    expect(model.pending.size).toBe(0);
    expect(model.kernels).toEqual([]);
    model.kernels = [base];
    const failing = new HpcKernelsModel(
      api(() => ({ kernels: [base] })),
      async () => {
        throw new Error('Kernel not found');
      },
      () => []
    );
    await failing.shutdown('k1');
    expect(failing.error).toBe('Could not shut down kernel k1: Kernel not found');
    failing.dispose();
  });
});
