/** The sections' React hooks, once: re-render on a model's changes, and a ticking clock. */

import * as React from 'react';

/** Anything with the models' change signal (ClustersModel, JobsModel, StorageModel, ...). */
export interface Observable {
  onChange(listener: () => void): () => void;
}

/** Re-render whenever `model` changes; returns a counter that grows with each change. */
export function useModel(model: Observable): number {
  const [version, setVersion] = React.useState(0);
  React.useEffect(() => model.onChange(() => setVersion(v => v + 1)), [model]);
  return version;
}

/** The time (in seconds) every `seconds`, for ages and durations. */
export function useNow(seconds: number): number {
  const [now, setNow] = React.useState(Date.now() / 1000);
  React.useEffect(() => {
    const t = setInterval(() => setNow(Date.now() / 1000), seconds * 1000);
    return () => clearInterval(t);
  }, [seconds]);
  return now;
}
