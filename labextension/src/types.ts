/** The REST shapes (see jupyter_cloudtik/server/openapi.yaml). */

export interface CloudTikEvent {
  id: number;
  op_id: string;
  ts: number;
  step: string;
  message: string;
  fraction: number | null;
  level: string;
  data: Record<string, unknown>;
}

/** What an operation works on (the server's structured form of `target`). */
export interface OperationResource {
  kind: string;
  name: string;
  part?: string;
}

export interface Operation {
  id: string;
  kind: string;
  /** `kind:name`, kept for older servers: read `resource` */
  target: string;
  resource?: OperationResource;
  state: string;
  reason: string | null;
  result?: unknown;
  cancel_requested: boolean;
  created_at: number;
  finished_at: number | null;
}

export interface NodeInfo {
  node_id: string;
  node_type: string;
  kind: string;
  status: string;
}

export interface Cluster {
  name: string;
  provider: string;
  state: string;
  reason: string | null;
  dashboard_link: string | null;
  /** a cluster running Spark: its UI through the server (`{base_url}cloudtik/spark/NAME/`) */
  spark_ui_link?: string | null;
  scheduler_address: string | null;
  target_workers: Record<string, number>;
  nodes: NodeInfo[];
  created_at: number;
  /** the latest operation; its warnings (e.g. oversubscribing this machine) are shown */
  last_operation?: { id: string; kind: string; state: string; warnings?: string[] } | null;
  summary: {
    workers: number;
    wanted_workers: number;
    cores: number;
    memory: number;
    gpus: number;
    age_seconds: number;
  };
}

export interface JSONSchema {
  type?: string | string[];
  title?: string;
  description?: string;
  default?: unknown;
  enum?: unknown[];
  const?: unknown;
  minimum?: number;
  maximum?: number;
  properties?: Record<string, JSONSchema>;
  required?: string[];
  [key: string]: unknown;
}

export interface ProviderInfo {
  name: string;
  available: boolean;
  default: boolean;
  reason?: string;
  title?: string;
  description?: string;
  config_schema?: JSONSchema;
  default_node_types?: Record<string, any>;
  /** under JupyterHub: a catalogue entry ("template" | "provider") an admin configured */
  kind?: string;
  /** under JupyterHub: the provider type behind the catalogue entry */
  provider_type?: string;
}

export interface Accepted {
  operation: Operation;
  cluster: string;
}
