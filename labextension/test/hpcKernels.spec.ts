import { describe, expect, it } from 'vitest';

import { describeKernel, formatLeft, HpcKernel, kernelFor, shortKernel } from '../src/hpcKernels';

const base: HpcKernel = { id: 'k1', backend: 'daint', profile: 'debug', state: 'queued' };

describe('kernelFor', () => {
  const queued = { ...base, job: '17', reason: 'Resources', session: '/srv/root/a/nb.ipynb', time: 5 };
  it('finds a kernel that has no id on the page yet by its notebook', () => {
    expect(kernelFor([queued], 'a/nb.ipynb', undefined)).toBe(queued);
    expect(kernelFor([queued], 'nb.ipynb', undefined)).toBe(queued); // same file name, ends with /nb.ipynb
    expect(kernelFor([queued], 'b/nb.ipynb', undefined)).toBeNull();
    expect(kernelFor([queued], 'xa/nb.ipynb', undefined)).toBeNull();
  });
  it('prefers the kernel id once the page has one, and never shows an orphan by path', () => {
    const running = { ...base, id: 'k2', state: 'running', session: queued.session };
    expect(kernelFor([queued, running], 'a/nb.ipynb', 'k2')).toBe(running);
    const orphan = { ...queued, id: 'k3', orphaned: true, state: 'dead' };
    expect(kernelFor([orphan], 'a/nb.ipynb', undefined)).toBeNull();
  });
  it('takes the newest of several starts for the same notebook', () => {
    const newer = { ...queued, id: 'k9', time: 9 };
    expect(kernelFor([queued, newer], 'a/nb.ipynb', null)).toBe(newer);
  });
});

describe('describeKernel', () => {
  it('says queued with the reason, where it runs and the wall time left, and why it died', () => {
    expect(describeKernel({ ...base, job: '17', reason: 'Resources' }, 0)).toBe(
      'daint: job 17 queued (Resources)'
    );
    expect(
      describeKernel({ ...base, state: 'running', job: '17', node: 'nid001', deadline: 7500 }, 0)
    ).toBe('daint: job 17 on nid001 · 2 h 5 min left');
    expect(
      describeKernel({ ...base, state: 'dead', job: '17', reason: 'the time limit was reached' }, 0)
    ).toBe('daint: job 17 ended: the time limit was reached');
    expect(describeKernel({ ...base, state: 'submitting' }, 0)).toBe(
      "daint: submitting the kernel's job"
    );
  });
  it('formats what is left', () => {
    expect(formatLeft(-3)).toBe('no wall time left');
    expect(formatLeft(42)).toBe('42 s left');
    expect(formatLeft(600)).toBe('10 min left');
    expect(formatLeft(3600)).toBe('1 h left');
  });
});

describe('shortKernel', () => {
  it('fits the toolbar: the backend and the state, the reason or the time left', () => {
    expect(shortKernel({ ...base, reason: 'Priority' }, 0)).toBe('daint: queued (Priority)');
    expect(shortKernel({ ...base, state: 'running', deadline: 1800 }, 60)).toBe('daint: 29 min left');
    expect(shortKernel({ ...base, state: 'dead', reason: 'cancelled (scancel)' }, 0)).toBe('daint: ended');
  });
});
