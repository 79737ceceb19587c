/**
 * jupyter-cloudtik: the "Clusters" side panel of JupyterLab (clusters, storage, HPC jobs).
 *
 * Everything it shows comes from the server extension's REST API, the same that the
 * %cluster magics in kernels use, so the panel and notebooks see the same clusters and the
 * same live progress.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Dialog, ICommandPalette, showDialog } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { KernelAPI } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { LabIcon } from '@jupyterlab/ui-components';

import { serverApi } from './api';
import { OPEN_DASHBOARD, setupDashboards } from './dashboards';
import { HpcKernelsModel } from './hpcKernelsModel';
import { JobsModel } from './jobs';
import { CUSTOM_SIZE_COMMAND, setupCustomSizes } from './hpcKernelSizeForm';
import { addHpcKernelStatus, HpcKernelStatusBarItem } from './kernelQueue';
import { ClustersModel } from './model';
import { CloudTikPanel } from './panel';
import { DEFAULT_PREFERENCES, Preferences } from './sections/props';
import { SidekicksModel } from './sidekicks';

const PLUGIN_ID = 'jupyter-cloudtik:plugin';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
  '<g class="jp-icon3" fill="#616161"><circle cx="12" cy="5" r="3"/><circle cx="5" cy="18" r="3"/>' +
  '<circle cx="19" cy="18" r="3"/><path d="M11 8h2v3.2l5.2 4-1.2 1.6-5-3.8-5 3.8-1.2-1.6 5.2-4z"/></g></svg>';

export const clustersIcon = new LabIcon({ name: 'jupyter-cloudtik:clusters', svgstr: ICON_SVG });

export namespace CommandIDs {
  export const open = 'cloudtik:open';
  export const insertClientCode = 'cloudtik:insert-code';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Clusters side panel of jupyter_cloudtik',
  autoStart: true,
  optional: [
    ILayoutRestorer,
    ISettingRegistry,
    INotebookTracker,
    ILauncher,
    ICommandPalette,
    IStatusBar
  ],
  activate: async (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null,
    launcher: ILauncher | null,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null
  ) => {
    const model = new ClustersModel(serverApi());
    const jobs = new JobsModel(serverApi());
    model.onEvent(event => jobs.handleEvent(event));
    const sidekicks = new SidekicksModel(serverApi());
    const kernelspecs = app.serviceManager.kernelspecs;
    const hpcKernels = new HpcKernelsModel(
      serverApi(),
      async id => {
        await KernelAPI.shutdownKernel(id, app.serviceManager.serverSettings);
      },
      () => Object.keys(kernelspecs.specs?.kernelspecs ?? {})
    );
    kernelspecs.specsChanged.connect(() => hpcKernels.specsChanged());
    let preferences: Preferences = { ...DEFAULT_PREFERENCES };

    const insertCode = async (code: string) => {
      const current = notebooks?.currentWidget;
      if (!current) {
        throw new Error('Open a notebook first: the client code goes into the active notebook.');
      }
      const notebook = current.content;
      NotebookActions.insertBelow(notebook);
      notebook.activeCell?.model.sharedModel.setSource(code);
      app.shell.activateById(current.id);
    };
    const confirm = async (title: string, body: string, action: string) => {
      const result = await showDialog({
        title,
        body,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action })]
      });
      return result.button.accept;
    };

    const openPath = async (path: string) => {
      await app.commands.execute('docmanager:open', { path });
    };

    setupDashboards(app, restorer);
    const openDashboard = async (cluster: string, page: string, url: string) => {
      await app.commands.execute(OPEN_DASHBOARD, { cluster, page, url });
    };

    const panel = new CloudTikPanel({
      openDashboard,
      clusters: model,
      jobs,
      sidekicks,
      hpcKernels,
      preferences,
      insertCode,
      openPath,
      confirm
    });
    panel.id = 'jupyter-cloudtik-panel';
    panel.title.icon = clustersIcon;
    panel.title.caption = 'CloudTik: clusters, storage, jobs';
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, 'jupyter-cloudtik-panel');
    // the side-kick list is polled only while someone can see it
    sidekicks.isShown = () => panel.isVisible && !document.hidden;
    hpcKernels.isShown = () => panel.isVisible && !document.hidden;

    app.commands.addCommand(CommandIDs.open, {
      label: 'Show the CloudTik panel (clusters, storage, jobs)',
      execute: () => app.shell.activateById(panel.id)
    });

    if (settingRegistry) {
      try {
        const settings = await settingRegistry.load(PLUGIN_ID);
        const apply = () => {
          preferences = { ...DEFAULT_PREFERENCES, ...(settings.composite as Partial<Preferences>) };
          panel.update({ preferences });
          model.setRefresh(preferences.refreshInterval);
          jobs.setRefresh(preferences.refreshInterval);
        };
        settings.changed.connect(apply);
        apply();
      } catch (reason) {
        console.warn('jupyter-cloudtik: settings not loaded', reason);
      }
    }
    // a notebook whose HPC kernel has the size the user chooses (profiles that allow it)
    setupCustomSizes(app, serverApi(), launcher, clustersIcon);
    palette?.addItem({ command: CUSTOM_SIZE_COMMAND, category: 'Notebook Operations', args: { isPalette: true } });
    // an HPC kernel's batch job (queued and why, node, wall time) in its notebook's toolbar
    notebooks?.widgetAdded.connect((_, nb) => addHpcKernelStatus(serverApi(), nb));
    if (notebooks && statusBar) {
      statusBar.registerStatusItem('jupyter-cloudtik:hpc-kernel', {
        item: new HpcKernelStatusBarItem(notebooks),
        align: 'left',
        rank: 5 // after the kernel's own status
      });
    }
    void model.start(preferences.refreshInterval);
    void jobs.start(preferences.refreshInterval);
    void sidekicks.start();
  }
};

export default plugin;
