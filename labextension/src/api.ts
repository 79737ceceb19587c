/** The CloudTikApi of the model, over JupyterLab's ServerConnection (auth, XSRF, base URL). */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ApiError, CloudTikApi, errorFromResponse } from './model';

export const API_PATH = 'cloudtik/api';

export function serverApi(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): CloudTikApi {
  const url = (path: string) => URLExt.join(settings.baseUrl, API_PATH, path);
  return {
    async request<T>(path: string, init: { method?: string; body?: unknown } = {}) {
      let response: Response;
      try {
        response = await ServerConnection.makeRequest(
          url(path),
          {
            method: init.method ?? 'GET',
            body: init.body === undefined ? undefined : JSON.stringify(init.body),
            headers: { 'Content-Type': 'application/json' }
          },
          settings
        );
      } catch (e) {
        throw new ApiError(`the Jupyter server did not answer: ${String(e)}`, 0);
      }
      if (!response.ok) {
        throw await errorFromResponse(response);
      }
      return (await response.json()) as T;
    },
    fetcher: (path, init) => ServerConnection.makeRequest(url(path), init, settings)
  };
}
