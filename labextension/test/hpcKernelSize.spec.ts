import { describe, expect, it } from 'vitest';

import {
  customProfiles,
  describeBounds,
  initialValues,
  sizeRequest
} from '../src/hpcKernelSize';

const meta = (profile: string, extra: Record<string, unknown>) => ({
  backend: 'daint',
  profile,
  cores: 1,
  time: 1800,
  memory: null,
  gpus: null,
  ...extra
});

// the kernel specs as GET /api/kernelspecs gives them (hpc/kernels/specs.py, spec_dict)
const specs = {
  python3: { name: 'python3', display_name: 'Python 3', metadata: {} },
  'cloudtik-hpc-daint-debug': {
    name: 'cloudtik-hpc-daint-debug',
    display_name: 'Python 3 on daint — 1 core, 30 min',
    metadata: { cloudtik: meta('debug', { custom: { cores: 2, time: 3600, memory: 2 ** 32 } }) }
  },
  'cloudtik-hpc-daint-large': {
    name: 'cloudtik-hpc-daint-large',
    display_name: 'Python 3 on daint — 8 cores, 2 h',
    metadata: { cloudtik: meta('large', { cores: 8, time: 7200, custom: null }) }
  },
  'cloudtik-hpc-daint-debug--c2-t45m': {
    name: 'cloudtik-hpc-daint-debug--c2-t45m',
    display_name: 'Python 3 on daint — 2 cores, 45 min',
    metadata: { cloudtik: meta('debug', { cores: 2, time: 2700, custom: null, custom_size: true }) }
  }
};

describe('customProfiles', () => {
  it('offers the profiles whose admin set custom bounds, not the others nor sizes already made', () => {
    const ps = customProfiles(specs);
    expect(ps.map(p => p.spec)).toEqual(['cloudtik-hpc-daint-debug']);
    expect(customProfiles(null)).toEqual([]);
  });
  it('says what is allowed', () => {
    const [p] = customProfiles(specs);
    expect(describeBounds(p)).toBe(
      'at most 2 cores, 1 h of wall time, 4 GiB of memory, no GPU (and what the partition has)'
    );
  });
});

describe('sizeRequest', () => {
  const ps = customProfiles(specs);
  it('starts from the profile and sends what was typed, minutes as the server reads them', () => {
    const v = initialValues(ps[0]);
    expect(v).toEqual({ choice: 'daint/debug', cores: '1', time: '30m', memory: '', gpus: '' });
    expect(sizeRequest(ps, { ...v, cores: '2', time: '45' })).toEqual({
      body: { backend: 'daint', profile: 'debug', cores: 2, time: '45m' }
    });
    expect(sizeRequest(ps, { ...v, memory: ' 2GiB ', gpus: '0' })).toEqual({
      body: { backend: 'daint', profile: 'debug', cores: 1, time: '30m', memory: '2GiB', gpus: 0 }
    });
  });
  it('names the field a person must fix, and leaves sizes to the server', () => {
    const v = initialValues(ps[0]);
    expect(sizeRequest(ps, { ...v, cores: 'two' })).toEqual({
      error: "cores: 'two' is not a core count; use 1 or more"
    });
    expect(sizeRequest(ps, { ...v, cores: '0' })).toHaveProperty('error');
    expect(sizeRequest(ps, { ...v, time: ' ' })).toEqual({
      error: 'time: give the wall time (e.g. 90m or 2h)'
    });
    expect(sizeRequest(ps, { ...v, gpus: '-1' })).toEqual({ error: "gpus: '-1' is not a GPU count" });
    expect(sizeRequest(ps, { ...v, choice: 'daint/large' })).toEqual({
      error: 'profile: choose one of daint/debug'
    });
    // beyond the bounds is the server's to refuse (it checks the partition too)
    expect(sizeRequest(ps, { ...v, cores: '64' })).toHaveProperty('body');
  });
});

describe('a profile of the hub', () => {
  // the same profile name offered by the server's own config and by the hub's catalogue
  const both = {
    ...specs,
    'cloudtik-hub-daint-debug': {
      name: 'cloudtik-hub-daint-debug',
      display_name: 'Python 3 on daint — 1 core, 30 min (hub)',
      metadata: { cloudtik: meta('debug', { custom: { cores: 2, time: 3600 }, hub: true }) }
    }
  };
  it('is a choice of its own, and its size is asked of the hub', () => {
    const ps = customProfiles(both);
    const hub = ps.find(p => p.spec === 'cloudtik-hub-daint-debug')!;
    const own = ps.find(p => p.spec === 'cloudtik-hpc-daint-debug')!;
    const v = initialValues(hub);
    expect(v.choice).toBe('hub:daint/debug');
    expect(initialValues(own).choice).toBe('daint/debug');
    expect(sizeRequest(ps, { ...v, cores: '2', time: '45' })).toEqual({
      body: { backend: 'daint', profile: 'debug', hub: true, cores: 2, time: '45m' }
    });
  });
});
