/**
 * Cluster dashboards as JupyterLab main-area tabs: the whole Dask dashboard or one of its
 * individual plots (task stream, progress, worker memory, CPU, graph), each an IFrame of
 * the page the server serves at {base_url}cloudtik/dashboard/NAME/PAGE.  The tabs are
 * tracked so the layout restorer reopens them after a page reload, as dask-labextension's.
 */

import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { IFrame, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';

export const OPEN_DASHBOARD = 'cloudtik:open-dashboard';

/** The pages a cluster's panel offers, in the order shown. */
export const DASHBOARD_PAGES: { page: string; label: string }[] = [
  { page: 'status', label: 'Dashboard' },
  { page: 'individual-task-stream', label: 'Task stream' },
  { page: 'individual-progress', label: 'Progress' },
  { page: 'individual-workers-memory', label: 'Worker memory' },
  { page: 'individual-cpu', label: 'CPU' },
  { page: 'individual-graph', label: 'Graph' }
];

/** The URL of one page of a cluster's dashboard, from its dashboard link (…/NAME/status). */
export function pageUrl(dashboardLink: string, page: string): string {
  return dashboardLink.replace(/\/status\/?$/, '') + '/' + page;
}

export interface DashboardArgs {
  cluster: string;
  page: string;
  url: string;
}

/** Register the open command and the tracker the layout restorer reopens tabs from. */
export function setupDashboards(app: JupyterFrontEnd, restorer: ILayoutRestorer | null): void {
  const tracker = new WidgetTracker<MainAreaWidget<IFrame>>({ namespace: 'cloudtik-dashboard' });
  const argsOf = new WeakMap<MainAreaWidget<IFrame>, DashboardArgs>();
  app.commands.addCommand(OPEN_DASHBOARD, {
    label: args => `Open ${String(args.page ?? 'dashboard')} of ${String(args.cluster ?? '')}`,
    execute: args => {
      const a = args as unknown as DashboardArgs;
      // only this server's dashboard route: never an arbitrary URL in a tab
      if (!a.url || !a.url.startsWith('/') || a.url.indexOf('/cloudtik/dashboard/') < 0) {
        throw new Error(`not a cluster dashboard of this server: ${a.url}`);
      }
      const id = `cloudtik-dashboard-${a.cluster}-${a.page}`;
      const open = tracker.find(w => w.id === id);
      if (open) {
        app.shell.activateById(open.id);
        return open;
      }
      // same origin, so the dashboard's own websockets pass the server's origin check
      const content = new IFrame({ sandbox: ['allow-scripts', 'allow-same-origin'] });
      content.addClass('jp-CloudTik-dashboardFrame');
      // JupyterLab's spinner until the page has loaded (a dashboard can take seconds: the
      // server waits for a starting scheduler), not a white tab; shown anyway after 30 s
      const loaded = new Promise<void>(resolve => {
        const frame = content.node.querySelector('iframe');
        frame?.addEventListener('load', () => resolve(), { once: true });
        window.setTimeout(resolve, 30_000);
      });
      content.url = a.url;
      const widget = new MainAreaWidget({ content, reveal: loaded });
      widget.node.dataset.state = 'loading';
      void loaded.then(() => {
        widget.node.dataset.state = 'ready';
      });
      widget.id = id;
      const label = DASHBOARD_PAGES.find(p => p.page === a.page)?.label ?? a.page;
      widget.title.label = `${a.cluster}: ${label}`;
      widget.title.closable = true;
      widget.addClass('jp-CloudTik-dashboardTab');
      widget.node.dataset.cluster = a.cluster;
      widget.node.dataset.page = a.page;
      argsOf.set(widget, a);
      void tracker.add(widget);
      app.shell.add(widget, 'main');
      return widget;
    }
  });
  if (restorer) {
    void restorer.restore(tracker, {
      command: OPEN_DASHBOARD,
      args: w => ({ ...(argsOf.get(w) ?? {}) }) as any,
      name: w => w.id
    });
  }
}
