import * as React from 'react';

import { SectionProps } from './props';

function Placeholder(props: { what: string; magic: string }): JSX.Element {
  return (
    <div className="jp-CloudTik-placeholder">
      {props.what} will be listed here. From a notebook: <code>{props.magic}</code>
    </div>
  );
}

export function JobsSection(_props: SectionProps): JSX.Element {
  return <Placeholder what="HPC jobs" magic="%hpc" />;
}
