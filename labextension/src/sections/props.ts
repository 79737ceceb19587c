import { ClustersModel } from '../model';

/** User preferences from the settings registry (schema/plugin.json). */
export interface Preferences {
  refreshInterval: number;
  defaultProvider: string;
  defaultWorkers: number;
  confirmShutdown: boolean;
}

export const DEFAULT_PREFERENCES: Preferences = {
  refreshInterval: 10,
  defaultProvider: '',
  defaultWorkers: 2,
  confirmShutdown: true
};

/** What every section gets from the panel. */
export interface SectionProps {
  clusters: ClustersModel;
  preferences: Preferences;
  /** put code into the active notebook (a new cell below the active one) */
  insertCode: (code: string) => Promise<void>;
  /** ask the user to confirm; resolves true when they did */
  confirm: (title: string, body: string, action: string) => Promise<boolean>;
}
