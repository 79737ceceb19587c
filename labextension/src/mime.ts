/**
 * The renderer of `%storage add`'s form in notebook cells (storageAdd.ts says why).
 *
 * Registered with `safe: false`: JupyterLab renders it only in trusted outputs — those
 * the live session just produced — never from an untrusted saved notebook, whose outputs
 * could otherwise offer a form that sends a typed secret somewhere the user did not ask
 * for.  The kernel replaces the form with its result line, so saved notebooks hold none.
 */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { serverApi } from './api';
import { ApiError, CloudTikApi } from './model';
import {
  askedFieldMatches,
  buildAddBody,
  missingValue,
  readStorageAdd,
  StorageAddData,
  summaryRows
} from './storageAdd';

export const STORAGE_ADD_MIME = 'application/vnd.cloudtik.storage-add+json';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export class StorageAddRenderer extends Widget implements IRenderMime.IRenderer {
  constructor(
    readonly mimeType: string,
    private readonly api: () => CloudTikApi = () => serverApi()
  ) {
    super();
    this.addClass('jp-CloudTik-storageAdd');
    // typing in the fields is not a notebook shortcut
    this.node.setAttribute('data-lm-suppress-shortcuts', 'true');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this.node.textContent = '';
    const data = model.trusted ? readStorageAdd(model.data[this.mimeType]) : null;
    if (!data) {
      this.node.appendChild(
        el('div', 'jp-CloudTik-storageAddNote', 'A storage form that is not shown here: ' +
          'it is not from this session, or not one this version understands.')
      );
      return;
    }
    this.render(data);
  }

  private render(data: StorageAddData): void {
    const name = data.request.name;
    this.node.dataset.name = name;
    this.node.dataset.state = 'ready';
    const form = el('form', 'jp-CloudTik-form jp-CloudTik-storageAddForm');
    form.autocomplete = 'off';
    const title = el('div', 'jp-CloudTik-storageAddTitle', 'Add storage ');
    title.appendChild(el('b', '', name));
    form.appendChild(title);

    const table = el('table', 'jp-CloudTik-storageAddSummary');
    for (const [key, value] of summaryRows(data)) {
      const tr = el('tr');
      tr.appendChild(el('th', '', key));
      tr.appendChild(el('td', '', value));
      table.appendChild(tr);
    }
    form.appendChild(table);

    const inputs = new Map<string, HTMLInputElement>();
    for (const key of data.ask) {
      const label = el('label', 'jp-CloudTik-field');
      label.appendChild(el('span', '', data.secret.includes(key) ? `${key} (secret)` : key));
      const input = el('input', 'jp-mod-styled');
      input.type = 'password';
      input.name = `ask-${key}`;
      input.autocomplete = 'new-password';
      input.spellcheck = false;
      label.appendChild(input);
      form.appendChild(label);
      inputs.set(key, input);
    }

    const error = el('div', 'jp-CloudTik-error jp-CloudTik-formError');
    error.setAttribute('role', 'alert');
    error.style.display = 'none';
    const note = el(
      'div',
      'jp-CloudTik-storageAddNote',
      'Typed values go from this browser to the Jupyter server, not through the kernel, ' +
        'and are not saved in the notebook. Interrupt the kernel to cancel.'
    );
    const button = el(
      'button',
      'jp-Button jp-mod-styled jp-mod-accept jp-CloudTik-storageAddButton',
      'Add'
    );
    button.type = 'submit';
    form.append(error, note, button);
    this.node.appendChild(form);

    const showError = (message: string, field: string | null) => {
      error.textContent = message;
      error.style.display = '';
      this.node.dataset.state = 'error';
      for (const [key, input] of inputs) {
        input.classList.toggle('jp-mod-invalid', askedFieldMatches(key, field));
      }
    };

    form.addEventListener('submit', event => {
      event.preventDefault();
      void (async () => {
        const values: Record<string, string> = {};
        for (const [key, input] of inputs) {
          values[key] = input.value;
        }
        const missing = missingValue(data, values);
        if (missing) {
          showError(`${missing}: type a value`, `options.${missing}`);
          return;
        }
        button.disabled = true;
        this.node.dataset.state = 'sending';
        try {
          await this.api().request('storages', { method: 'POST', body: buildAddBody(data, values) });
        } catch (e) {
          button.disabled = false;
          const field = e instanceof ApiError ? e.field : null;
          showError(e instanceof Error ? e.message : String(e), field);
          return;
        }
        for (const input of inputs.values()) {
          input.value = '';
          input.disabled = true;
        }
        error.style.display = 'none';
        note.textContent = `Storage ${name} is added; the kernel replaces this form with its result.`;
        this.node.dataset.state = 'added';
      })();
    });
  }
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: false,
  mimeTypes: [STORAGE_ADD_MIME],
  defaultRank: 50,
  createRenderer: options => new StorageAddRenderer(options.mimeType)
};

const extension: IRenderMime.IExtension = {
  id: 'jupyter-cloudtik:storage-add',
  description: "The form of a notebook's %storage add (secrets typed in the browser)",
  rendererFactory,
  rank: 50,
  dataType: 'json'
};

export default extension;
