import { HpcKernelsModel } from '../hpcKernelsModel';
import { JobsModel } from '../jobs';
import { ClustersModel } from '../model';
import { SidekicksModel } from '../sidekicks';

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
  jobs: JobsModel;
  /** the user's side-kicks (under JupyterHub only) */
  sidekicks: SidekicksModel;
  /** this server's kernels on HPC backends */
  hpcKernels: HpcKernelsModel;
  preferences: Preferences;
  /** put code into the active notebook (a new cell below the active one) */
  insertCode: (code: string) => Promise<void>;
  /** open a page of a cluster's dashboard (served by this server) as a JupyterLab tab */
  openDashboard?: (cluster: string, page: string, url: string) => Promise<void>;
  /** open a file (a path under the server's root folder) in JupyterLab */
  openPath: (path: string) => Promise<void>;
  /** ask the user to confirm; resolves true when they did */
  confirm: (title: string, body: string, action: string) => Promise<boolean>;
}
