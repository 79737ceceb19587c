/**
 * The sections of the side panel, top to bottom.
 *
 * A feature adds its section by writing a component in this folder and listing it here.
 */

import { ComponentType } from 'react';

import { ClustersSection } from './clusters';
import { HpcKernelsSection, useHpcKernelsVisible } from './hpcKernels';
import { JobsSection } from './jobs';
import { SidekicksSection, useSidekicksVisible } from './sidekicks';
import { StorageSection } from './storage';
import { SectionProps } from './props';

export interface SectionSpec {
  id: string;
  title: string;
  component: ComponentType<SectionProps>;
  /** open when the panel first shows */
  open: boolean;
  /** a hook: is the section there at all (default: always)? */
  useVisible?: (props: SectionProps) => boolean;
}

export const SECTIONS: SectionSpec[] = [
  { id: 'clusters', title: 'Clusters', component: ClustersSection, open: true },
  {
    id: 'sidekicks',
    title: 'Side-kicks',
    component: SidekicksSection,
    open: true,
    useVisible: useSidekicksVisible
  },
  { id: 'storage', title: 'Storage', component: StorageSection, open: false },
  { id: 'jobs', title: 'Jobs', component: JobsSection, open: false },
  {
    id: 'hpc-kernels',
    title: 'HPC kernels',
    component: HpcKernelsSection,
    open: false,
    useVisible: useHpcKernelsVisible
  }
];

export type { SectionProps };
