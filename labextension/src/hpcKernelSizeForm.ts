/**
 * The launcher's "HPC kernel of a custom size…" card and its form (hpcKernelSize.ts has
 * the pure parts).  On "Start", the server checks the size (POST hpc/kernel-sizes) and
 * names the kernel spec; a new notebook then opens with that kernel, which queues as any
 * HPC kernel does (its toolbar says so).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ILauncher } from '@jupyterlab/launcher';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import {
  choiceOf,
  CustomProfile,
  customProfiles,
  describeBounds,
  initialValues,
  SizeValues,
  sizeRequest
} from './hpcKernelSize';
import { CloudTikApi } from './model';

export const CUSTOM_SIZE_COMMAND = 'cloudtik:hpc-kernel-custom-size';

class SizeForm extends Widget implements Dialog.IBodyWidget<SizeValues> {
  private readonly inputs: Record<keyof SizeValues, HTMLInputElement | HTMLSelectElement>;
  private readonly bounds: HTMLElement;

  constructor(
    profiles: CustomProfile[],
    values: SizeValues,
    error: string | null
  ) {
    super();
    this.addClass('jp-CloudTikKernelSize');
    const node = this.node;
    if (error) {
      const e = document.createElement('div');
      e.className = 'jp-CloudTikKernelSize-error';
      e.setAttribute('role', 'alert');
      e.textContent = error;
      node.appendChild(e);
    }
    const select = document.createElement('select');
    select.name = 'choice';
    for (const p of profiles) {
      const o = document.createElement('option');
      o.value = choiceOf(p);
      o.textContent = `${p.title} (${p.profile})`;
      select.appendChild(o);
    }
    select.value = values.choice;
    const field = (name: keyof SizeValues, label: string, hint: string) => {
      const input = document.createElement('input');
      input.name = name;
      input.value = values[name];
      input.placeholder = hint;
      input.setAttribute('aria-label', label);
      return input;
    };
    this.inputs = {
      choice: select,
      cores: field('cores', 'Cores', '1'),
      time: field('time', 'Wall time', '90m, 2h or 1:30:00'),
      memory: field('memory', 'Memory', "the profile's (e.g. 8GiB)"),
      gpus: field('gpus', 'GPUs', 'none')
    };
    const labels: [keyof SizeValues, string][] = [
      ['choice', 'Profile'],
      ['cores', 'Cores'],
      ['time', 'Wall time'],
      ['memory', 'Memory'],
      ['gpus', 'GPUs']
    ];
    for (const [key, text] of labels) {
      const label = document.createElement('label');
      label.className = 'jp-CloudTikKernelSize-field';
      const span = document.createElement('span');
      span.textContent = text;
      label.append(span, this.inputs[key]);
      node.appendChild(label);
    }
    this.bounds = document.createElement('p');
    this.bounds.className = 'jp-CloudTikKernelSize-bounds';
    node.appendChild(this.bounds);
    const show = () => {
      const p = profiles.find(x => choiceOf(x) === select.value);
      this.bounds.textContent = p ? `Allowed: ${describeBounds(p)}.` : '';
    };
    select.addEventListener('change', () => {
      const p = profiles.find(x => choiceOf(x) === select.value);
      if (p) {
        const v = initialValues(p);
        for (const key of ['cores', 'time', 'memory', 'gpus'] as const) {
          this.inputs[key].value = v[key];
        }
      }
      show();
    });
    show();
  }

  getValue(): SizeValues {
    return {
      choice: this.inputs.choice.value,
      cores: this.inputs.cores.value,
      time: this.inputs.time.value,
      memory: this.inputs.memory.value,
      gpus: this.inputs.gpus.value
    };
  }
}

async function currentProfiles(app: JupyterFrontEnd): Promise<CustomProfile[]> {
  const specs = app.serviceManager.kernelspecs;
  await specs.ready;
  return customProfiles(specs.specs?.kernelspecs as any);
}

/** Ask for a size until the server takes one (or the user cancels); then open a new
 *  notebook with the kernel spec it named. */
async function chooseAndStart(app: JupyterFrontEnd, api: CloudTikApi, cwd: string) {
  const profiles = await currentProfiles(app);
  if (profiles.length === 0) {
    await showDialog({
      title: 'No custom sizes',
      body:
        'No HPC kernel profile offers custom sizes here: an admin sets ' +
        'c.HPCKernels.profiles[].custom (docs/hpc.md, "Interactive kernels").',
      buttons: [Dialog.okButton()]
    });
    return;
  }
  let values = initialValues(profiles[0]);
  let error: string | null = null;
  for (;;) {
    const result = await showDialog({
      title: 'HPC kernel of a custom size',
      body: new SizeForm(profiles, values, error),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Start' })],
      focusNodeSelector: 'input[name="cores"]'
    });
    if (!result.button.accept || !result.value) {
      return;
    }
    values = result.value;
    const asked = sizeRequest(profiles, values);
    if ('error' in asked) {
      error = asked.error;
      continue;
    }
    try {
      const answer = await api.request<{ name: string; display_name: string }>(
        'hpc/kernel-sizes',
        { method: 'POST', body: asked.body }
      );
      await app.serviceManager.kernelspecs.refreshSpecs();
      await app.commands.execute('notebook:create-new', { cwd, kernelName: answer.name });
      return;
    } catch (e) {
      error = e instanceof Error ? e.message : String(e);
    }
  }
}

/** The command, and a launcher card while some profile offers custom sizes. */
export function setupCustomSizes(
  app: JupyterFrontEnd,
  api: CloudTikApi,
  launcher: ILauncher | null,
  icon?: LabIcon
): void {
  app.commands.addCommand(CUSTOM_SIZE_COMMAND, {
    icon: args => (args.isPalette ? undefined : icon),
    label: args => (args.isPalette ? 'New HPC kernel of a custom size…' : 'HPC kernel…'),
    caption: 'A notebook whose kernel runs as a batch job of the size you choose',
    execute: args => chooseAndStart(app, api, String(args.cwd ?? ''))
  });
  if (!launcher) {
    return;
  }
  let card: { dispose(): void } | null = null;
  const refresh = async () => {
    const offered = (await currentProfiles(app)).length > 0;
    if (offered && !card) {
      card = launcher.add({
        command: CUSTOM_SIZE_COMMAND,
        category: 'Notebook',
        rank: 1000,
        // the Notebook category's cards show a kernel's icon, else the label's first letter
        kernelIconUrl: icon ? `data:image/svg+xml;base64,${btoa(icon.svgstr)}` : undefined
      });
    } else if (!offered && card) {
      card.dispose();
      card = null;
    }
  };
  app.serviceManager.kernelspecs.specsChanged.connect(() => void refresh());
  void refresh();
}
